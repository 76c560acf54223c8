"""Tests of the scoring in ``benchmarks/transfer.py`` on a few real reference curves.

``benchmarks/`` is not a package, so the script is loaded from its path (it puts the repo root
on ``sys.path`` itself, as when run directly).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from hpo.trials.curve_bank import bank_curves, load_bank
from predictors import Predictor

REPO = Path(__file__).resolve().parents[1]
BANK = REPO / "configs/calibration/default_bank.parquet"
PREDICTOR = REPO / "hpo/data/predictors/default.json"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transfer_benchmark", REPO / "benchmarks/transfer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


transfer = _load_script()


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor.load(PREDICTOR)


@pytest.fixture(scope="module")
def curves() -> list:
    """A low-τ and a high-τ curve at TPP 20 and at TPP 80: four curves, a second to score."""
    all_curves = bank_curves(load_bank(BANK))
    picked, seen = [], set()
    for c in sorted(all_curves, key=lambda c: (c.controls.tokens_per_param, c.controls.tau)):
        key = (c.controls.tokens_per_param, c.controls.tau > 0.3)
        if key not in seen:
            seen.add(key)
            picked.append(c)
    return picked[:4]


@pytest.fixture(scope="module")
def rows(predictor: Predictor, curves: list) -> list:
    return transfer.score_bank(predictor, curves, t_min=0.05)


def test_oracle_never_worse_than_predictor(rows: list) -> None:
    assert len(rows) == 4
    for r in rows:
        assert 0 < r.oracle_mae <= r.mae, r.run_id
        assert r.ratio >= 1.0


def test_decision_error_matches_direct_prediction(predictor: Predictor, curves: list, rows: list) -> None:
    curve, row = curves[0], rows[0]
    s = 0.2
    # The scheduler's history at rung s: up to and including the first point with t̂ ≥ s.
    n = int(np.argmax(curve.t_hat >= s)) + 1
    assert curve.t_hat[n - 1] >= s > curve.t_hat[n - 2]
    direct = predictor.predict_final(curve.t_hat[:n], curve.loss[:n], curve.controls).final_loss
    assert row.decision_error[s] == pytest.approx(direct / curve.final_loss - 1.0, abs=1e-12)
    assert math.isfinite(row.decision_error[0.1])


def test_decision_error_agrees_with_scheduler(predictor: Predictor, curves: list, rows: list) -> None:
    """The script predicts exactly as the scheduler's rung entry does (``RungJudge.entry``, which ``CollapseScheduler`` calls)."""
    pytest.importorskip("ray")
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.decisions.scheduler_contract import SchedulerSettings
    from hpo.decisions.scheduler_state import TrialRecord

    scheduler = CollapseScheduler(predictor=predictor, settings=SchedulerSettings(rungs=[0.1, 0.3]))
    curve, row = curves[1], rows[1]
    rec = TrialRecord(trial_id="t", controls=curve.controls.to_dict(),
                      history=[[float(t), float(y)] for t, y in zip(curve.t_hat, curve.loss)])
    for r, s in enumerate((0.1, 0.3)):
        entry = scheduler._judge.entry(rec, r)
        assert entry.predicted_final_loss is not None, entry.reason
        assert row.decision_error[s] == pytest.approx(entry.predicted_final_loss / curve.final_loss - 1.0, abs=1e-12)


def test_empty_inputs_raise_clear_errors(predictor: Predictor, tmp_path: Path) -> None:
    with pytest.raises(transfer.TransferError, match="no curves"):
        transfer.score_bank(predictor, [], t_min=0.05)
    missing = tmp_path / "absent.parquet"
    with pytest.raises(transfer.TransferError, match="absent.parquet: no such curve bank"):
        transfer.load_curves(missing)
    empty = tmp_path / "empty.parquet"
    load_bank(BANK).iloc[:0].to_parquet(empty)
    with pytest.raises(transfer.TransferError, match="empty.parquet: no completed curves"):
        transfer.load_curves(empty)


def test_main_reports_missing_bank_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = transfer.main(["--bank", str(tmp_path / "absent.parquet"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "absent.parquet" in err


def test_direct_collapse_pairs_only_matching_controls() -> None:
    # A curve against itself collapses exactly; it is paired only with reference curves of the
    # same TPP, τ, η and B (a second seed of the same configuration), never with other τ.
    curves = bank_curves(load_bank(BANK))
    one = curves[0]
    rows = transfer.direct_collapse([one], curves, t_min=0.05)
    assert rows and all(r["tau"] == one.controls.tau for r in rows)
    self_row = next(r for r in rows if r["reference_run_id"] == r["run_id"])
    assert self_row["mae_from_0.05"] == 0.0 and self_row["mae_from_0.2"] == 0.0
    assert len(rows) < len(curves)
