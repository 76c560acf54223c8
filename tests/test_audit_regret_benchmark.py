"""Tests of ``benchmarks/audit_regret.py`` on a tiny synthetic audit bank (seconds).

``benchmarks/`` is not a package, so the script is loaded from its file (it puts the repo
root on ``sys.path`` itself, as ``benchmarks/decisions.py`` does).

The synthetic sweep: 4 τ values (TPP 20), each curve exactly L·ℓ̂(t̂; τ) of a small fixed
predictor, logged at t̂ = k/50. Low τ is lower early, so the curves cross:

| config | τ    | final seed 1 | final seed 2 | lowest at |
|--------|------|--------------|--------------|-----------|
| a      | 0.05 | 1.740        | 1.746        | s = 0.1   |
| b      | 0.1  | 1.780        | 1.786        |           |
| c      | 0.4  | 1.700 (best) | 1.706 (best) |           |
| d      | 0.8  | 1.705        | 1.711        | s = 0.2   |

Seed 2 = seed 1 + 0.006 for every config: σ_seed = 0.006/√2 = 0.00424, band = √2·σ = 0.006.
current-best@0.2 picks d (regret 0.005: a tie by the band, though above σ), current-best@0.1
picks a (regret 0.04: no tie); the exact predictor predicts every final, so predicted-best
picks c (regret 0). Seed 3 is only half banked (c, d missing).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from predictors.io import json_safe
from hpo.trials.curve_bank import append_runs, curve_frame, load_bank
from predictors import Controls, Predictor, SurrogateParams
from predictors.predictor import DecisionError

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "audit_regret.py"
_spec = importlib.util.spec_from_file_location("audit_regret", SCRIPT)
audit = importlib.util.module_from_spec(_spec)
sys.modules["audit_regret"] = audit  # dataclasses look their module up while the script loads
_spec.loader.exec_module(audit)

E_OF_S = 0.01
PREDICTOR = Predictor(SurrogateParams(0.3, -1.1, 0.11, 0.0, m=0.14), m_fitted=True,
                      decision_error=DecisionError((0.1, 0.2, 0.3, 0.5), (E_OF_S,) * 4))
T_HAT = np.arange(1, 51) / 50.0  # exact at 0.1, 0.2, 0.3, 0.5 and 1
CONFIGS = {"a": (0.05, 1.740), "b": (0.1, 1.780), "c": (0.4, 1.700), "d": (0.8, 1.705)}
SEED_OFFSET = {1: 0.0, 2: 0.006, 3: 0.003}
DELTA = 0.006
N_PARAMS, TPP, BATCH, ETA = 100_000, 20.0, 2048, 0.01
TOTAL = int(N_PARAMS * TPP)


def _run(label: str, seed: int):
    tau, final = CONFIGS[label]
    final += SEED_OFFSET[seed]
    run = {
        "run_id": f"{label}{seed}", "sweep": "audit", "tau": tau, "tokens_per_param": TPP, "schedule": "linear",
        "warmup_fraction": 0.1, "decay_fraction": 0.2, "n_params": N_PARAMS, "total_tokens": TOTAL,
        "batch_size": BATCH, "eta": ETA, "weight_decay": BATCH / (ETA * tau * TOTAL), "d_model": 64,
        "n_layers": 2, "seq_len": 64, "seed": seed, "data_seed": seed, "corpus_hash": "x",
        "status": "completed", "config_json": "{}",
    }
    loss = final * PREDICTOR.normalized_curve(T_HAT, Controls(tau, TPP))
    points = [{"step": k + 1, "tokens": int(round(t * TOTAL)), "train_fraction": float(t),
               "train_loss": float(v), "smoothed_loss": float(v), "val_loss": math.nan, "lr": ETA}
              for k, (t, v) in enumerate(zip(T_HAT, loss))]
    return curve_frame(run, points)


TRIALS = [audit.Trial("syn", f"tau={CONFIGS[lab][0]:g}", seed, f"{lab}{seed}")
          for lab in CONFIGS for seed in (1, 2, 3)]
MISSING = {"c3", "d3"}


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    path = tmp_path_factory.mktemp("audit") / "bank.parquet"
    append_runs(path, [_run(t.run_id[0], t.seed) for t in TRIALS if t.run_id not in MISSING])
    return path


@pytest.fixture(scope="module")
def report(bank):
    return audit.evaluate(load_bank(bank), TRIALS, {audit.PRED_FITTED: PREDICTOR}, PREDICTOR, (0.1, 0.2))


def _case(report, rule: str, s: float, seed: int):
    (case,) = [c for c in report.sweeps["syn"].cases if c.rule == rule and c.fraction == s and c.seed == seed]
    return case


# Asserts: a missing run is reported (sweep, seed, configuration, run_id, why), its replicate is
# left out of the scoring and the complete replicates are still scored.
def test_missing_runs_are_reported_not_fatal(report):
    sweep = report.sweeps["syn"]
    assert {m["run_id"] for m in report.missing} == MISSING
    assert all(m["why"] == "not banked" and m["seed"] == 3 for m in report.missing)
    assert sweep.complete_seeds == [1, 2] and sweep.n_scorable == 10 and sweep.n_trials == 12
    assert {c.seed for c in sweep.cases} == {1, 2}
    text = audit.render(report)
    assert "c3" in text and "not banked" in text
    json.dumps(json_safe(asdict(report)), allow_nan=False)  # the JSON output is valid


# Asserts: a rule that picks the true best has regret exactly 0 (here predicted-best, whose
# predictor is exact), also against the seed-mean finals; its keep-set holds the best.
def test_regret_zero_for_true_best(report):
    for seed in (1, 2):
        for s in (0.1, 0.2):
            case = _case(report, audit.PRED_FITTED, s, seed)
            assert case.pick_run == f"c{seed}" and case.regret == 0.0 and case.tie is True
            assert case.mean_regret == 0.0
            keep = _case(report, audit.KEEP, s, seed)
            # e(s) = 1%: c (best) and d (0.3% worse) are kept, a and b (≥ 2.3% worse) are not.
            assert keep.keep_size == 2 and keep.best_in_keep is True and keep.regret == 0.0


# Asserts: σ_seed is the pooled within-config std across seeds and the band is √2·σ; a pick
# counts as a tie when its regret ≤ band (0.005 ≤ 0.006, though above σ = 0.0042) and not
# when above it (0.04); the cell counts ties over replicates.
def test_ties_use_the_seed_band(report):
    sweep = report.sweeps["syn"]
    assert sweep.sigma_seed == pytest.approx(DELTA / math.sqrt(2), rel=1e-6)
    assert sweep.band == pytest.approx(DELTA, rel=1e-6)
    at_02 = _case(report, audit.CURRENT, 0.2, 1)
    assert at_02.pick_label == "tau=0.8" and at_02.regret == pytest.approx(0.005, abs=1e-9)
    assert sweep.sigma_seed < at_02.regret <= sweep.band and at_02.tie is True
    at_01 = _case(report, audit.CURRENT, 0.1, 1)
    assert at_01.pick_label == "tau=0.05" and at_01.regret == pytest.approx(0.04, abs=1e-9) and at_01.tie is False
    assert sweep.cells[audit.CURRENT]["0.2"].ties == 2 and sweep.cells[audit.CURRENT]["0.1"].ties == 0
    # Mean regrets 0.005 (current) vs 0 (predicted) at 0.2 are within the band: "as good".
    assert "as good at s = 0.2" in sweep.sentence


# Asserts: the benchmark's keep-set at s is exactly what CollapseScheduler keeps at a last rung
# at s on the same curves (replayed through the simulator), and its predictions are the
# scheduler's recorded ones.
@pytest.mark.parametrize("s", [0.1, 0.2])
def test_keep_set_is_the_schedulers(bank, s):
    from hpo.trials.replay import run_points
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.decisions.scheduler_contract import SchedulerSettings
    from hpo.trials.simulator import SimulatedSweep

    frame = load_bank(bank)
    runs = ["a1", "b1", "c1", "d1"]
    views = audit.run_views(frame, runs)
    benchmark = audit.keep_set(PREDICTOR, views, runs, s)
    scheduler = CollapseScheduler(predictor=PREDICTOR, settings=SchedulerSettings(rungs=[s]))
    SimulatedSweep(scheduler, {r: run_points(frame, r) for r in runs}).run()
    rung = scheduler.state.rungs[0]
    assert sorted(benchmark.kept) == sorted(rung.survivors) and len(benchmark.kept) == 2
    assert benchmark.margin == pytest.approx(rung.margin)
    for r in runs:
        assert audit.predict_final_at(PREDICTOR, views[r].history, views[r].controls, s) == \
            rung.entries[r].predicted_final_loss


# Asserts: a missing config or bank file gives a one-line error naming the file (exit code 2).
def test_missing_files_are_one_line_errors(tmp_path, capsys):
    assert audit.main(["--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope.yaml" in err and "\n" not in err
    config = tmp_path / "audit.yaml"
    config.write_text("trainer: {tau: 0.3}\nsweeps:\n  x: {lr: [0.01]}\n"
                      f"predictor_out: null\nbank: {tmp_path / 'absent.parquet'}\n")
    assert audit.main(["--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "absent.parquet" in err and "\n" not in err
    # An invalid run names the config file too.
    config.write_text(config.read_text().replace("trainer: {tau: 0.3}", "trainer: {}"))
    assert audit.main(["--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(config) in err and "\n" not in err
