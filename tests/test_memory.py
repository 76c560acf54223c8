"""The memory budget of a calibration from curves: refused before any parsing or fitting, with
the memory the work would need."""

from __future__ import annotations

import pytest

from hpo.calibration import memory
from hpo.calibration.curve_import import CurveImportError, load_curves_file
from hpo.calibration.memory import MemoryBudgetError, check_fit_memory, fit_memory_mb, read_memory_mb


def _short_cells(path, rows: int) -> None:
    # 2 bytes per cell: the cell count, not the bytes, is what bounds pandas' memory here.
    path.write_text("run_id,train_fraction,loss\n" + "1,1,1\n" * rows)


def test_a_file_of_many_short_cells_is_refused_by_its_cell_count_before_parsing(tmp_path, monkeypatch):
    path = tmp_path / "curves.csv"
    _short_cells(path, 200_000)
    need = read_memory_mb(path.stat().st_size, 200_001, 3)
    assert need > read_memory_mb(path.stat().st_size, 0, 0) + 10  # the count, not the bytes, decides
    monkeypatch.setenv("HPO_MEMORY_MB", str(need - 5))
    monkeypatch.setattr("pandas.read_csv", lambda *a, **k: pytest.fail("parsed a file over the budget"))
    with pytest.raises(CurveImportError, match=r"curves.csv: reading this curve file .*200,001 rows x 3 columns"
                                               r"\) needs about [\d,]+ MB, above the memory budget of [\d,]+ MB "
                                               r"\(set HPO_MEMORY_MB=N"):
        load_curves_file(path)


def test_the_same_file_is_read_within_a_budget_that_holds_it(tmp_path, monkeypatch):
    path = tmp_path / "curves.csv"
    _short_cells(path, 200_000)
    monkeypatch.setenv("HPO_MEMORY_MB", str(read_memory_mb(path.stat().st_size, 200_001, 3) + 1))
    with pytest.raises(CurveImportError) as refused:  # read, then refused for what it holds, not its size
        load_curves_file(path)
    assert "memory budget" not in str(refused.value)


def test_a_huge_sparse_file_is_refused_from_its_size_without_reading_it(tmp_path, monkeypatch):
    path = tmp_path / "big.csv"
    with open(path, "wb") as handle:
        handle.truncate(8 * 2**30)
    monkeypatch.setattr(memory, "_shape", lambda p: pytest.fail("counted rows the size already refuses"))
    with pytest.raises(CurveImportError, match=r"big.csv: reading this curve file \(8,192 MB\) needs about"):
        load_curves_file(path)


def test_a_fit_over_the_budget_names_its_curves_and_need():
    monkeypatch_budget = memory.MEMORY_BUDGET_MB
    curves = int((monkeypatch_budget - fit_memory_mb(0)) * 1024 / memory.FIT_KB_PER_CURVE) + 1
    with pytest.raises(MemoryBudgetError, match=rf"file:x.csv: calibrating {curves:,} curves needs about"):
        check_fit_memory(curves, "file:x.csv")
    check_fit_memory(curves - 1, "file:x.csv")


@pytest.mark.parametrize("raw", ["lots", "0", "-1", "nan", "inf"])
def test_a_bad_budget_is_named(raw, monkeypatch):
    monkeypatch.setenv("HPO_MEMORY_MB", raw)
    with pytest.raises(MemoryBudgetError, match="HPO_MEMORY_MB"):
        memory.memory_budget_mb()


# ----------------------------------------------------------------------------- a training run


def test_a_trials_memory_estimate_bounds_what_it_was_measured_at_and_scales_with_the_micro_batch() -> None:
    # Peak RSS of the tiny trainer of the tests, measured with `python -m trainers.memory`
    # (2 logging intervals): 367 MB at 2,048 tokens a step, 600 MB at 16,384, 1,194 MB at 65,536.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sweep_fixtures import TINY_TRAINER
    from trainers.config import TrainConfig
    from trainers.memory import estimate_train_memory

    def estimate(**changes: object) -> float:
        config = TrainConfig.model_validate({**TINY_TRAINER, "lr": 0.01, **changes})
        return estimate_train_memory(config, data_tokens=10 * 2**20).total_mb

    for batch, measured in ((2048, 367), (16384, 600), (65536, 1194)):
        assert measured < estimate(batch_size=batch) < 2 * measured
    # Gradient accumulation: the activations of one forward pass, not of the whole step.
    assert estimate(batch_size=65536, micro_batch_size=2048) == estimate(batch_size=2048)
    assert estimate(batch_size=2**30) > 1e6  # the 2^30-token step of the bad-input table: terabytes


def test_a_calibration_that_would_run_for_days_is_refused_with_the_time(monkeypatch) -> None:
    from hpo.calibration.memory import check_fit_time, fit_seconds

    monkeypatch.delenv("HPO_TIME_BUDGET_S", raising=False)
    check_fit_time(48, "curves.csv", held_out=True)  # 242 s measured: within the hour
    with pytest.raises(MemoryBudgetError, match=r"big.csv: calibrating 17,682 curves with held-out refits would take "
                                                r"about [\d,.]+ days, above the time budget of 1.0 h"):
        check_fit_time(17_682, "big.csv", held_out=True)
    check_fit_time(17_682, "big.csv", held_out=False)  # no refits: not this estimate's business
    monkeypatch.setenv("HPO_TIME_BUDGET_S", str(fit_seconds(17_682) + 1))
    check_fit_time(17_682, "big.csv", held_out=True)
