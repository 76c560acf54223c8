"""Bring-your-own curves (hpo/calibration/curve_import.py): files, MLflow, and errors that name the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpo.trials.curve_bank import load_bank
from hpo.calibration.curve_import import CurveImportError, curves_from_frame, load_curves_file, load_mlflow_curves

EXAMPLE = Path(__file__).resolve().parents[1] / "configs/curves/example_curves.csv"


def _frame() -> pd.DataFrame:
    return pd.read_csv(EXAMPLE)


def _load(frame: pd.DataFrame, **kw):
    return curves_from_frame(frame, source="test.csv", **kw)


def test_example_file_gives_the_banked_runs_with_their_tau():
    # Six curves; τ derived from η, B, λ and D equals the bank's τ for the same runs.
    imported = load_curves_file(EXAMPLE)
    assert len(imported.curves) == 6 and imported.source.startswith("file:")
    bank = load_bank(Path(__file__).resolve().parents[1] / "configs/calibration/default_bank.parquet")
    taus = bank.groupby(bank["run_id"].str[:6])["tau"].first()
    for curve in imported.curves:
        assert curve.controls.tau == pytest.approx(taus[curve.meta["name"][4:]], rel=1e-6)
        assert curve.controls.n_params == 100672 and curve.t_hat[-1] == pytest.approx(1.0)


def test_example_file_calibrates():
    # The imported curves go through the same fit as banked runs.
    from predictors import fit

    result = fit(load_curves_file(EXAMPLE).curves, t_min=0.05, fit_m=True, decision_fractions=())
    assert np.isfinite(result.fit_mae) and result.fit_mae < 0.05


def test_csv_and_parquet_agree(tmp_path):
    _frame().to_parquet(tmp_path / "c.parquet")
    a, b = load_curves_file(EXAMPLE).curves, load_curves_file(tmp_path / "c.parquet").curves
    assert all(np.array_equal(x.loss, y.loss) and x.controls == y.controls for x, y in zip(a, b))


def test_step_positions_and_direct_tau_match_tokens_and_derived_tau():
    frame = _frame()
    base = _load(frame).curves
    steps = frame.assign(step=frame["tokens"] // frame["batch_size"]).drop(columns="tokens")
    for x, y in zip(base, _load(steps).curves):
        np.testing.assert_allclose(x.t_hat, y.t_hat)
    taus = {c.meta["name"]: c.controls.tau for c in base}
    direct = frame.assign(tau=frame["run_id"].map(taus)).drop(columns=["eta", "weight_decay"])
    assert [c.controls.tau for c in _load(direct).curves] == pytest.approx([c.controls.tau for c in base])


@pytest.mark.parametrize("column", ["run_id", "loss", "tokens_per_param", "n_params", "schedule"])
def test_missing_required_column_is_named(column):
    with pytest.raises(CurveImportError, match=f"'{column}'"):
        _load(_frame().drop(columns=column))


def test_missing_position_or_timescale_is_named():
    with pytest.raises(CurveImportError, match="position"):
        _load(_frame().drop(columns="tokens"))
    with pytest.raises(CurveImportError, match="'weight_decay'"):
        _load(_frame().drop(columns="weight_decay"))


def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "c.txt").write_text("x")
    with pytest.raises(CurveImportError, match="'.txt'"):
        load_curves_file(tmp_path / "c.txt")
    with pytest.raises(CurveImportError, match="no such curve file"):
        load_curves_file(tmp_path / "nope.csv")


def test_nan_tail_run_is_left_out_with_a_note():
    frame = _frame()
    first = frame["run_id"].iloc[0]
    tail = (frame["run_id"] == first) & (frame["tokens"] > 0.6 * frame["total_tokens"])
    frame.loc[tail, "loss"] = np.nan
    imported = _load(frame)
    assert len(imported.curves) == 5 and first not in {c.meta["name"] for c in imported.curves}
    assert any(first in n and "diverged" in n for n in imported.notes)


def test_no_complete_run_is_one_error_listing_why():
    frame = _frame()
    frame = frame[frame["tokens"] < 0.5 * frame["total_tokens"]]
    with pytest.raises(CurveImportError, match="no complete run.*before the end of training"):
        _load(frame)


def test_bad_values_are_named_with_run_and_column():
    frame = _frame()
    first = frame["run_id"].iloc[0]
    varying = frame.copy()
    varying.loc[varying.index[0], "eta"] = 0.02
    with pytest.raises(CurveImportError, match=f"run {first}: column 'eta' varies"):
        _load(varying)
    negative = frame.copy()
    negative.loc[negative.index[3], "loss"] = -1.0
    with pytest.raises(CurveImportError, match="'loss' must be > 0"):
        _load(negative)
    text = frame.astype({"n_params": object})
    text.loc[text["run_id"] == first, "n_params"] = "big"
    with pytest.raises(CurveImportError, match="'n_params' is not a number"):
        _load(text)
    with pytest.raises(CurveImportError, match="t̂"):
        _load(frame.assign(total_tokens=frame["total_tokens"] // 2))


def test_empty_run_id_or_underivable_tau_is_named():
    frame = _frame()
    with pytest.raises(CurveImportError, match="'run_id' is empty in 1 row"):
        _load(frame.assign(run_id=frame["run_id"].where(frame.index != 7)))
    first = frame["run_id"].iloc[0]
    partial = frame.assign(tau=np.where(frame["run_id"] == first, np.nan, 0.4)).drop(columns="eta")
    with pytest.raises(CurveImportError, match=f"run {first}: column 'tau' is empty.*'eta'"):
        _load(partial)


def test_smoothing_fraction_smooths_each_run():
    frame = _frame()
    raw, smooth = _load(frame).curves[0], _load(frame, smoothing_fraction=0.05)
    assert not np.allclose(raw.loss, smooth.curves[0].loss)
    assert any("smoothed" in n for n in smooth.notes)
    with pytest.raises(CurveImportError, match="smoothing_fraction"):
        _load(frame, smoothing_fraction=0.7)


def _log_run(client, experiment, run_id, rows, *, with_fraction, resumed=False, extra=()):
    """Log one file run to MLflow as our sweeps do (params + step metrics); returns its id."""
    from mlflow.entities import Metric, Param

    run = client.create_run(experiment, run_name=run_id)
    first = rows.iloc[0]
    params = [Param(k, str(first[k])) for k in ("eta", "batch_size", "weight_decay", "tokens_per_param",
                                                 "n_params", "schedule", "warmup_fraction", "total_tokens")]
    steps = (rows["tokens"] // rows["batch_size"]).tolist()
    metrics = [Metric("loss", float(v), 2, int(s)) for v, s in zip(rows["loss"], steps)]
    if with_fraction:
        metrics += [Metric("train_fraction", float(t) / float(first["total_tokens"]), 2, int(s))
                    for t, s in zip(rows["tokens"], steps)]
    if resumed:
        metrics = [Metric("loss", 99.0, 1, int(s)) for s in steps[:3]] + metrics
    client.log_batch(run.info.run_id, metrics=metrics, params=params + list(extra))
    return run.info.run_id


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """A SQLite MLflow store with two experiments. "mine": 3 runs with params, a loss and a
    train_fraction history, and a parent run with params only (as our sweeps write). "steps":
    2 runs with a loss history only (position = MLflow step), τ logged as "Infinity" (no finite
    τ; derive it), the first run resumed (its first 3 steps logged twice, the later values
    right), and a bare run with neither params nor metrics."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("mine")
    parent = client.create_run(experiment, run_name="sweep")
    client.log_batch(parent.info.run_id, params=[Param("name", "sweep")])
    frame = _frame()
    ids = {}
    for run_id, rows in list(frame.groupby("run_id"))[:3]:
        ids[_log_run(client, experiment, run_id, rows, with_fraction=True)] = run_id
    steps_experiment = client.create_experiment("steps")
    client.create_run(steps_experiment, run_name="bare")
    for i, (run_id, rows) in enumerate(list(frame.groupby("run_id"))[:2]):
        # Step positions only, τ logged as json.dumps(inf); the first run was resumed and
        # re-logged its first three steps (the earlier values, 99, must not win).
        ids[_log_run(client, steps_experiment, run_id, rows, with_fraction=False, resumed=(i == 0),
                     extra=[Param("tau", "Infinity")])] = run_id
    return uri, experiment, ids, steps_experiment


def test_mlflow_experiment_gives_the_same_curves_as_the_file(mlflow_store):
    uri, experiment, ids, _ = mlflow_store
    imported = load_mlflow_curves(experiment, tracking_uri=uri)
    assert len(imported.curves) == 3 and any("skipped" in n for n in imported.notes)
    by_name = {c.meta["name"]: c for c in _load(_frame()).curves}
    for curve in imported.curves:
        same = by_name[ids[curve.meta["name"]]]
        np.testing.assert_allclose(curve.t_hat, same.t_hat)
        np.testing.assert_allclose(curve.loss, same.loss)
        assert curve.controls.tau == pytest.approx(same.controls.tau)


def test_unknown_mlflow_experiment_is_named(mlflow_store):
    uri, _, _, _ = mlflow_store
    with pytest.raises(CurveImportError, match="no MLflow experiment with id '999'"):
        load_mlflow_curves("999", tracking_uri=uri)


def test_mlflow_steps_resumed_runs_and_derived_tau(mlflow_store):
    # Without a train_fraction history the MLflow step is the optimizer step (× B / D); a step
    # logged twice keeps its last value; τ logged as "Infinity" is derived from η, B, λ; the
    # run name lands in meta; a run with neither params nor metrics is skipped without a note.
    uri, _, ids, steps_experiment = mlflow_store
    imported = load_mlflow_curves(steps_experiment, tracking_uri=uri)
    assert len(imported.curves) == 2 and not any("skipped" in n for n in imported.notes)
    assert sum("repeated step" in n for n in imported.notes) == 1
    by_name = {c.meta["name"]: c for c in _load(_frame()).curves}
    for curve in imported.curves:
        same = by_name[ids[curve.meta["name"]]]
        assert curve.meta["run_name"] == ids[curve.meta["name"]]
        np.testing.assert_allclose(curve.t_hat, same.t_hat)
        np.testing.assert_allclose(curve.loss, same.loss)
        assert curve.controls.tau == pytest.approx(same.controls.tau)


def test_exact_duplicate_rows_are_dropped_with_a_note_and_conflicting_ones_named():
    # A public log held thousands of stale copies of its rows: identical copies are dropped and
    # counted per run; two rows at one position with different losses stay a named error.
    frame = _frame()
    first = frame["run_id"].iloc[0]
    copies = frame[frame["run_id"] == first].head(7)
    imported = _load(pd.concat([frame, copies, copies], ignore_index=True))
    clean = _load(frame)
    assert [np.array_equal(a.loss, b.loss) for a, b in zip(imported.curves, clean.curves)] == [True] * len(clean.curves)
    assert any(f"dropped 14 exact duplicate row(s): run {first} (14)" in n for n in imported.notes)
    conflict = copies.head(1).assign(loss=copies["loss"].iloc[0] + 0.5)
    with pytest.raises(CurveImportError, match=f"run {first}: duplicate positions"):
        _load(pd.concat([frame, conflict], ignore_index=True))


def test_zero_warmup_is_accepted_and_an_assumed_warmup_is_said():
    # warmup_fraction = 0 is a schedule without warmup; a file without the column gets our
    # trainer's 10% with a note rather than silently.
    frame = _frame()
    assert not any("warmup_fraction not given" in n for n in _load(frame).notes)
    zero = _load(frame.assign(warmup_fraction=0.0))
    assert {c.controls.schedule.warmup_fraction for c in zero.curves} == {0.0}
    missing = _load(frame.drop(columns="warmup_fraction"))
    assert {c.controls.schedule.warmup_fraction for c in missing.curves} == {0.1}
    assert any("warmup_fraction not given for every run: 10% assumed" in n for n in missing.notes)
    with pytest.raises(CurveImportError, match="'warmup_fraction' must be a finite number >= 0"):
        _load(frame.assign(warmup_fraction=-0.1))


def test_no_weight_decay_is_tau_infinity():
    # weight_decay = 0 (plain Adam) or tau = inf: the τ = ∞ limit, not an error.
    frame = _frame()
    first = frame["run_id"].iloc[0]
    no_decay = _load(frame.assign(weight_decay=np.where(frame["run_id"] == first, 0.0, frame["weight_decay"])))
    taus = {c.meta["name"]: c.controls.tau for c in no_decay.curves}
    assert taus[str(first)] == np.inf and all(np.isfinite(t) for r, t in taus.items() if r != str(first))
    direct = _load(frame.drop(columns=["eta", "weight_decay"]).assign(tau=np.inf))
    assert {c.controls.tau for c in direct.curves} == {np.inf}


def test_from_mlflow_leaves_a_database_that_is_not_an_mlflow_store_untouched(tmp_path) -> None:
    # MLflow would add its ~70 tables to any SQLite file it is pointed at.
    import sqlite3

    from hpo.calibration.curve_import import CurveImportError, load_mlflow_curves

    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(CurveImportError, match="not an MLflow store"):
        load_mlflow_curves("1", tracking_uri=f"sqlite:///{path}")
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["notes"]
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 10)
    with pytest.raises(CurveImportError, match="not an SQLite database"):
        load_mlflow_curves("1", tracking_uri=f"sqlite:///{tmp_path / 'junk.db'}")


def test_positions_must_increase_within_a_run_in_file_order() -> None:
    frame = _frame()
    first = frame["run_id"].iloc[0]
    rows = frame.index[frame["run_id"] == first]
    swapped = frame.copy()
    swapped.loc[[rows[2], rows[3]], "tokens"] = frame.loc[[rows[3], rows[2]], "tokens"].to_numpy()
    with pytest.raises(CurveImportError, match=f"run {first}: column 'tokens' decreases within the run"):
        _load(swapped)
    interleaved = pd.concat([frame[frame["run_id"] == first], frame[frame["run_id"] != first]]).iloc[::-1]
    with pytest.raises(CurveImportError, match="decreases"):  # every run reversed
        _load(interleaved)


def test_a_loss_too_small_to_be_a_cross_entropy_is_refused() -> None:
    frame = _frame()
    frame.loc[10, "loss"] = 1e-300
    with pytest.raises(CurveImportError, match=r"column 'loss' is 1e-300 .* at least 1e-06"):
        _load(frame)


def test_a_fifo_is_refused_without_opening_it(tmp_path) -> None:
    import os

    os.mkfifo(tmp_path / "curves.csv")
    with pytest.raises(CurveImportError, match="curves.csv: is a FIFO"):  # open() would block for ever
        load_curves_file(tmp_path / "curves.csv")


def test_a_run_logged_every_200_steps_that_ends_one_interval_before_the_end_is_complete():
    # 3,000 steps evaluated every 200 from step 100: the last point is at step 2,900 (T - 100),
    # t̂ 0.967 < 0.99, and within one logging interval of the end: complete. The same run cut
    # at step 2,500 (two intervals short) is not.
    steps = np.arange(100, 3000, 200)
    rows = pd.DataFrame({"run_id": "r", "step": steps, "batch_size": 1000, "loss": 4.0 - steps / 3000,
                         "tau": 0.5, "tokens_per_param": 20, "n_params": 150_000, "schedule": "linear",
                         "warmup_fraction": 0.1})
    curve = _load(rows).curves[0]
    assert curve.t_hat[-1] == pytest.approx(2900 / 3000) and curve.final_loss == pytest.approx(4.0 - 2900 / 3000)
    with pytest.raises(CurveImportError, match="before the end of training"):
        _load(rows[rows["step"] <= 2500])


def _schedule_frame(schedule: str, **columns) -> pd.DataFrame:
    t = np.linspace(0.0, 1.0, 21)
    frame = pd.DataFrame({"run_id": "r", "train_fraction": t, "loss": 4.0 - t, "tau": 0.3,
                          "tokens_per_param": 20, "n_params": 100_000, "schedule": schedule})
    for name, value in columns.items():
        frame[name] = value(t) if callable(value) else value
    return frame


def test_floor_and_cooldown_shape_columns_build_the_schedule():
    from predictors.schedules import Schedule

    imported = _load(_schedule_frame("wsd", warmup_fraction=0.05, decay_fraction=0.2, final_fraction=0.1,
                                     decay_shape="sqrt"))
    assert imported.curves[0].controls.schedule == Schedule("wsd", 0.05, 0.2, final_fraction=0.1, decay_shape="sqrt")
    # Without the columns: the floor 0 and the linear cooldown, as before they existed.
    plain = _load(_schedule_frame("wsd", warmup_fraction=0.05)).curves[0].controls.schedule
    assert (plain.final_fraction, plain.decay_shape) == (0.0, "linear")


def test_logged_schedule_is_read_from_logged_lr():
    lr = lambda t: 6e-4 * np.minimum(t / 0.1, 1.0) * np.where(t < 0.5, 1.0, 0.5)  # noqa: E731 - a step
    imported = _load(_schedule_frame("logged", logged_lr=lr))
    schedule = imported.curves[0].controls.schedule
    t = np.linspace(0.0, 1.0, 21)
    assert schedule.name == "logged" and schedule.warmup_fraction == pytest.approx(0.1)
    assert schedule(t).tolist() == (lr(t) / 6e-4).tolist()
    assert not any("warmup_fraction not given" in note for note in imported.notes)


@pytest.mark.parametrize("present", [False, True])
def test_logged_schedule_without_logged_lr_is_named(present):
    frame = _schedule_frame("logged", **({"logged_lr": np.nan} if present else {}))
    with pytest.raises(CurveImportError, match="run r: column 'logged_lr' is " + ("empty" if present else "missing")):
        _load(frame)


def test_parquet_struct_and_list_columns_are_read_as_text(tmp_path: Path) -> None:
    # A parquet file with nested columns (a struct, a list), even ones the import does not
    # need, was a TypeError (unhashable) where duplicate rows are found.
    import pandas as pd

    frame = pd.read_csv(EXAMPLE)
    frame["meta"] = [{"host": "a", "rank": i % 2} for i in range(len(frame))]
    frame["tags"] = [["x", str(i % 3)] for i in range(len(frame))]
    frame.to_parquet(tmp_path / "curves.parquet")
    imported = load_curves_file(tmp_path / "curves.parquet")
    assert len(imported.curves) == len(load_curves_file(EXAMPLE).curves) > 0


def test_a_curve_file_linked_to_proc_is_refused_in_one_line(tmp_path: Path) -> None:
    # /proc files pass as regular files; /proc/self/mem fails with EIO on read.
    (tmp_path / "curves.csv").symlink_to("/proc/self/mem")
    with pytest.raises(CurveImportError, match=r"curves.csv: is a file of the kernel's /proc"):
        load_curves_file(tmp_path / "curves.csv")
