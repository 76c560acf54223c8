"""benchmarks/search.py: the searcher is fed what the sweep feeds it (a stopped trial's predicted
final, or its truncated loss), the trace counts compute as spent, and a missed target reads missed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import search  # noqa: E402


@pytest.fixture(scope="module")
def grid() -> search.Grid:
    return search.load_grid(search.DEFAULT_BANK)


@pytest.fixture(scope="module")
def predictor():
    from hpo.data import default_predictor_path
    from predictors import Predictor

    return Predictor.load(default_predictor_path())


def test_the_grid_bank_is_a_table_of_every_configuration_and_seed(grid: search.Grid) -> None:
    assert set(grid.values) == {"lr", "weight_decay"} and len(grid.true_value) == 25 and len(grid.seeds) == 3
    assert all(set(by_seed) == set(grid.seeds) for by_seed in grid.runs.values())
    assert grid.sigma_seed > 0 and grid.best == min(grid.true_value.values())


def test_the_main_bank_is_a_grid_of_fifty_configurations_over_lr_decay_and_batch() -> None:
    grid = search.load_grid(search.DEFAULT_BANKS[0])
    assert set(grid.values) == {"lr", "weight_decay", "batch_size"} and grid.values["batch_size"] == [1024, 2048]
    assert len(grid.true_value) == 50 and len(grid.seeds) == 3
    assert all(set(by_seed) == set(grid.seeds) for by_seed in grid.runs.values())


def test_a_missing_bank_exits_2_before_any_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        search.main(["--bank", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "search.md")])
    assert exit_info.value.code == 2 and "none.parquet: no such file" in capsys.readouterr().err
    assert not (tmp_path / "search.md").exists()


@pytest.mark.parametrize("predicted", [True, False])
def test_tpe_with_collapse_is_told_predicted_finals_or_truncated_losses(grid, predictor, predicted: bool) -> None:
    build = search.methods(predictor, grid)["tpe+collapse (predicted)" if predicted else "tpe+collapse (truncated)"]
    scheduler, searcher = build(0)
    sweep = search.SearchedSweep(scheduler, searcher, grid, grid.seeds[0], budget=6.0)
    sweep.run()
    stopped = {tid: rec for tid, rec in scheduler.state.trials.items() if rec.status.value == "stopped"}
    assert stopped
    study = searcher.searcher._ot_study
    told = {tid: study.trials[ot.number].value for tid, ot in searcher.searcher._ot_trials.items()}
    assert set(told) == {t.trial_id for t in sweep.trials}  # every trial ended was told
    for tid, rec in stopped.items():
        expected = rec.latest_prediction["final_loss"] if predicted else sweep._last[tid]["loss"]
        assert told[tid] == pytest.approx(expected)
    # Compute is counted as spent, never falls, and suggestions stop at the budget.
    assert sweep.trace.compute == sorted(sweep.trace.compute)
    assert 6.0 <= sweep.spent() < 6.0 + 2 * 1.0 + 1e-9


def test_a_target_never_reached_is_missed() -> None:
    trace = search.Trace(compute=[1.0, 2.0], regret=[math.inf, 0.05])
    assert search.compute_to_target([trace], sigma=0.01, budget=2.0) is None
    assert search.compute_to_target([trace], sigma=0.05, budget=2.0) == 2.0
    assert trace.regret_at(0.5) == math.inf
