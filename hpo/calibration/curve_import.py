"""Bring-your-own curves: training-loss curves from a CSV/parquet file or an MLflow experiment.

``hpo calibrate --from-curves FILE`` and ``--from-mlflow EXPERIMENT_ID`` turn them into
``predictors.Curve`` objects and run the same fit, calibration and JSON as banked runs.

Long format, one row per logged point (the columns are documented in ``configs/curves/README.md``):

* point columns: ``run_id``, ``loss``, and a position: ``tokens`` (tokens seen), ``step``
  (optimizer steps; needs ``batch_size``) or ``train_fraction`` (t̂). With several, tokens win
  over step over train_fraction.
* per-run columns (constant within a run): ``tokens_per_param``, ``n_params``, ``schedule``,
  and either ``tau`` or all of ``eta`` (alias ``lr``), ``batch_size`` and ``weight_decay``
  (τ = B/(η·λ·D), paper Eq. 2). Optional: ``total_tokens`` (D; default TPP·N),
  ``warmup_fraction`` (0.1, with a note when assumed; 0 for no warmup), ``decay_fraction``
  (0.2), ``final_fraction`` (the floor η(1)/η_peak; 0), ``decay_shape`` (the WSD cooldown,
  ``linear`` or ``sqrt``; linear), ``seed``, ``corpus``, ``corpus_hash``, ``d_model``, ``run_name``.
* schedule ``logged``: the schedule is the run's own logged LR, from the point column
  ``logged_lr`` (the LR in force at that point; its warmup where it first peaks unless
  ``warmup_fraction`` is given).
* optional point columns: ``restart`` (1/true at the first point after a resume from a
  checkpoint) and ``micro_batch_size``; each restart and each change of micro-batch size is a
  marked change point the monitor does not judge (``meta["restarts"]``, t̂).

``weight_decay`` 0 (or ``tau`` ``inf``) is a run without weight decay (τ = ∞). Exact duplicate
rows are dropped with a note; two different rows at one run and position are an error.

A run with a non-finite loss is treated as diverged and left out with a note; so is a run that
does not reach the end of training (t̂ ≥ 0.99, or its last point within one logging interval of
the end: ``predictors.curves.reaches_end``) or has fewer than 5 points. Everything else that
is wrong raises one :class:`CurveImportError` naming the source, the column and the run; that
includes a loss above :data:`MAX_LOSS` (a cross-entropy in nats is far below it; such a value is
an overflow or a unit error, and the fit would overflow on it).

The MLflow source never creates a store: without ``--tracking-uri`` (or
``MLFLOW_TRACKING_URI``) it reads MLflow's default store in the working directory only if one is
there, an HTTP server must answer within seconds, and the URI's user part (a password) never
reaches a message or the predictor's provenance (``hpo.tracking.uri``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from hpo.common.errors import InputError
from hpo.common.paths import PathError, check_input_file
from hpo.calibration.memory import MemoryBudgetError, check_curve_file_memory
from hpo.tracking.uri import TrackingUriError, check_tracking_uri, strip_credentials, use_credentials
from predictors import Controls, Curve, smooth_loss
from predictors.curves import reaches_end
from predictors.equations import adamw_timescale
from predictors.normalize import T_HAT_SLACK
from predictors.schedules import SCHEDULE_NAMES, Schedule, logged_warmup

DOCS = "configs/curves/README.md"
REQUIRED = {
    "run_id": "one id per training run",
    "loss": "the training (or validation) loss at that point",
    "tokens_per_param": "TPP = D/N of the run",
    "n_params": "non-embedding parameter count N of the run",
    "schedule": f"LR schedule name, one of {', '.join(SCHEDULE_NAMES)}",
}
POSITIONS = ("tokens", "step", "train_fraction")
TAU_PARTS = ("eta", "batch_size", "weight_decay")
ALIASES = {"lr": "eta"}
OPTIONAL_RUN = ("total_tokens", "warmup_fraction", "decay_fraction", "final_fraction", "decay_shape", "seed",
                "corpus", "corpus_hash", "d_model", "run_name", "project")
#: Per-run columns read as numbers (the rest of OPTIONAL_RUN stay as given).
NUMERIC_OPTIONAL = ("warmup_fraction", "decay_fraction", "final_fraction")
#: The per-point column a ``logged`` schedule is read from: the LR in force at that point.
LOGGED_LR = "logged_lr"
# What MLflow params hold where a sweep had no finite τ (json.dumps of inf/None, or str()).
NO_VALUE = ("inf", "Infinity", "-Infinity", "NaN", "nan", "null", "None", "")
MIN_POINTS = 5
#: Largest loss accepted. Language-model losses in nats are O(1-10); 1e6 leaves room for any
#: unit while keeping the fit's squared residuals far from float overflow.
MAX_LOSS = 1e6
#: Smallest loss accepted: a cross-entropy in nats of a language model is far above it (the
#: entropy of text is ~1 nat/token); 1e-300 is an underflow or a unit error, and its log would
#: dominate the fit's residuals.
MIN_LOSS = 1e-6


class CurveImportError(InputError):
    """Imported curves are unusable; the message names the source, the column and the run."""


@dataclass(frozen=True)
class ImportedCurves:
    """Curves read from a user's file or MLflow experiment.

    Attributes:
        curves: complete, finite curves, sorted by run id.
        notes: runs left out and why, and the smoothing used.
        source: ``file:<path>`` or ``mlflow:<tracking uri>#<experiment id>``.
    """

    curves: list[Curve]
    notes: list[str] = field(default_factory=list)
    source: str = ""


def load_curves_file(path: str | Path, *, smoothing_fraction: float = 0.0,
                     complete_only: bool = True) -> ImportedCurves:
    """Read a ``.csv`` or ``.parquet`` curve file (never pickle) and build its curves.

    Example:
        Two runs logged by training fraction, one complete and one stopped at t̂ = 0.5 (left
        out with a note, since a fit needs whole curves):

        >>> import tempfile
        >>> import pandas as pd
        >>> rows = [{"run_id": run, "train_fraction": k / 10, "loss": 3.0 - 0.1 * k, "tau": 0.3,
        ...          "tokens_per_param": 20, "n_params": 100_000, "schedule": "linear",
        ...          "warmup_fraction": 0.1}
        ...         for run, last in (("full", 10), ("stopped", 5)) for k in range(1, last + 1)]
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = Path(tmp) / "curves.csv"
        ...     pd.DataFrame(rows).to_csv(path, index=False)
        ...     imported = load_curves_file(path)
        >>> [(c.meta["name"], len(c.t_hat), c.final_loss, c.controls.tau) for c in imported.curves]
        [('full', 10, 2.0, 0.3)]
        >>> imported.notes
        ['run stopped: ends at t̂ = 0.5, before the end of training; left out']
    """
    path = Path(path)
    try:
        check_input_file(path, what="curve file")  # missing, a directory, a FIFO (the read would block)
    except PathError as exc:
        raise CurveImportError(str(exc)) from None
    try:
        check_curve_file_memory(path)  # before parsing: a 99 MB CSV once grew to 8 GB in the fit
    except MemoryBudgetError as exc:
        raise CurveImportError(str(exc)) from None
    except OSError as exc:  # the file cannot be read (EIO, permissions): one line naming it
        raise CurveImportError(f"{path}: cannot read curve file: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path)
        elif suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            raise CurveImportError(f"{path}: unknown curve file type {suffix!r}; use .csv or .parquet")
    except CurveImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader error becomes one message naming the file
        raise CurveImportError(f"{path}: cannot read curve file: {exc}") from None
    return curves_from_frame(frame, source=f"file:{path.resolve()}", smoothing_fraction=smoothing_fraction,
                             complete_only=complete_only)


def curves_from_frame(frame: pd.DataFrame, *, source: str, smoothing_fraction: float = 0.0,
                      complete_only: bool = True) -> ImportedCurves:
    """Validate a long-format frame and turn each run into a ``Curve`` (see module docstring).

    ``complete_only=False`` (``hpo monitor``) keeps runs still in progress: a run is then left
    out only when it diverged or has fewer than :data:`MIN_POINTS` points."""
    if not (math.isfinite(smoothing_fraction) and 0.0 <= smoothing_fraction < 0.5):
        raise CurveImportError(f"smoothing_fraction: must be in [0, 0.5), got {smoothing_fraction!r}")
    frame = frame.rename(columns={k: v for k, v in ALIASES.items() if k in frame and v not in frame})
    frame = _hashable_cells(frame)
    _check_columns(frame, source)
    if frame.empty:
        raise CurveImportError(f"{source}: no rows")
    blank = int(frame["run_id"].isna().sum())
    if blank:
        raise CurveImportError(f"{source}: column 'run_id' is empty in {blank} row(s) "
                               f"(first at row {int(frame['run_id'].isna().to_numpy().argmax())}); every point needs its run")
    position = next(p for p in POSITIONS if p in frame)
    notes = []
    # Exact copies of a row (a log appended twice, stale copies of a run) carry no information:
    # drop them and say so. Rows that share a run and position but differ stay an error below.
    copies = frame.duplicated(keep="first")
    if copies.any():
        per_run = frame.loc[copies, "run_id"].astype(str).value_counts().sort_index()
        notes.append(f"dropped {int(copies.sum())} exact duplicate row(s): "
                     + ", ".join(f"run {run} ({count})" for run, count in per_run.items()))
        frame = frame.loc[~copies]
    # Without a warmup the import assumes our trainer's 10%; the warmup shifts the early shape
    # the prediction aligns to, so an assumed value is said, never silent.
    has_warmup = (frame.groupby("run_id", sort=True)["warmup_fraction"].apply(lambda v: v.notna().any())
                  if "warmup_fraction" in frame else None)
    assumed = (sorted(map(str, frame["run_id"].unique())) if has_warmup is None
               else [str(r) for r, given in has_warmup.items() if not given])
    # A logged schedule's warmup is read from its logged LR, not assumed.
    logged = set(map(str, frame.loc[frame["schedule"].astype(str) == "logged", "run_id"].unique()))
    assumed = [r for r in assumed if r not in logged]
    if assumed:
        which = "every run" if len(assumed) == frame["run_id"].nunique() else "runs " + ", ".join(assumed[:5]) + (
            f" and {len(assumed) - 5} more" if len(assumed) > 5 else "")
        notes.append(f"warmup_fraction not given for {which}: 10% assumed (give the column, 0 for no warmup)")
    curves = []
    for run_id, rows in frame.groupby("run_id", sort=True):
        curve, note = _run_curve(str(run_id), rows, position, source, smoothing_fraction, complete_only)
        if curve is None:
            notes.append(note)
        else:
            curves.append(curve)
    if smoothing_fraction:
        notes.append(f"losses smoothed by a trailing mean over {100 * smoothing_fraction:g}% of each run's tokens")
    if not curves:
        raise CurveImportError(f"{source}: no {'complete ' if complete_only else ''}run to "
                               f"{'calibrate on' if complete_only else 'read'}: " + "; ".join(notes))
    return ImportedCurves(curves, notes, source)


def _hashable_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the cells of struct, list or map columns (parquet's nested types: dicts,
    lists, arrays) as their text: duplicate rows and runs are found by hashing rows, and such a
    column, even one the import does not use, made that a TypeError."""
    nested = [c for c in frame.columns if frame[c].dtype == object
              and frame[c].map(lambda v: not isinstance(v, (str, bytes, int, float, bool, type(None)))).any()]
    if not nested:
        return frame
    frame = frame.copy()
    for column in nested:
        frame[column] = frame[column].map(lambda v: v if isinstance(v, (str, type(None))) else str(v))
    return frame


def _check_columns(frame: pd.DataFrame, source: str) -> None:
    missing = [f"'{c}' ({why})" for c, why in REQUIRED.items() if c not in frame]
    if not any(p in frame for p in POSITIONS):
        missing.append("a position: 'tokens' (tokens seen), 'step' (optimizer steps, with 'batch_size') "
                       "or 'train_fraction' (t̂ in [0, 1])")
    if "tau" not in frame and not all(c in frame for c in TAU_PARTS):
        lacking = [c for c in TAU_PARTS if c not in frame]
        missing.append("the timescale: 'tau', or 'eta' (or 'lr'), 'batch_size' and 'weight_decay' "
                       f"(lacking {', '.join(repr(c) for c in lacking)})")
    if "step" in frame and "tokens" not in frame and "batch_size" not in frame:
        missing.append("'batch_size' (tokens per optimizer step, to turn 'step' into tokens)")
    if missing:
        raise CurveImportError(f"{source}: missing column(s) {'; '.join(missing)}; see {DOCS}")


#: Per-run columns where 0 is a meaningful value: no warmup, no decay phase, no weight decay.
ZERO_ALLOWED = ("warmup_fraction", "decay_fraction", "final_fraction", "weight_decay")


def _run_value(rows: pd.DataFrame, column: str, run_id: str, source: str, numeric: bool = True) -> Any:
    values = rows[column].dropna().unique()
    if len(values) == 0:
        raise CurveImportError(f"{source}: run {run_id}: column '{column}' is empty")
    if len(values) > 1:
        raise CurveImportError(f"{source}: run {run_id}: column '{column}' varies within the run "
                               f"({', '.join(map(str, values[:3]))}); it must be one value per run")
    value = values[0]
    if not numeric:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CurveImportError(f"{source}: run {run_id}: column '{column}' is not a number ({value!r})") from None
    if column in ZERO_ALLOWED:
        if not math.isfinite(number) or number < 0:
            raise CurveImportError(f"{source}: run {run_id}: column '{column}' must be a finite number >= 0, got {value!r}")
    elif column == "tau" and number == math.inf:
        return number  # τ = ∞: a run without weight decay (λ = 0)
    elif not math.isfinite(number) or number <= 0:
        raise CurveImportError(f"{source}: run {run_id}: column '{column}' must be a finite number > 0"
                               + (" (or inf for no weight decay)" if column == "tau" else "") + f", got {value!r}")
    return number


def _numbers(rows: pd.DataFrame, column: str, run_id: str, source: str) -> np.ndarray:
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
    bad = np.isnan(values) & rows[column].notna().to_numpy()
    if bad.any():
        raise CurveImportError(f"{source}: run {run_id}: column '{column}' has non-numeric values "
                               f"({rows[column].to_numpy()[bad][0]!r})")
    return values


def _run_curve(run_id: str, rows: pd.DataFrame, position: str, source: str,
               smoothing_fraction: float, complete_only: bool = True) -> tuple[Optional[Curve], str]:
    """One run's curve, or (None, why it was left out)."""
    tpp = _run_value(rows, "tokens_per_param", run_id, source)
    n_params = _run_value(rows, "n_params", run_id, source)
    total = _run_value(rows, "total_tokens", run_id, source) if "total_tokens" in rows else tpp * n_params
    name = str(_run_value(rows, "schedule", run_id, source, numeric=False))
    if name not in SCHEDULE_NAMES:
        raise CurveImportError(f"{source}: run {run_id}: column 'schedule' is {name!r}, not one of {SCHEDULE_NAMES}")
    optional = {c: _run_value(rows, c, run_id, source, numeric=c in NUMERIC_OPTIONAL)
                for c in OPTIONAL_RUN if c in rows and rows[c].notna().any() and c != "total_tokens"}
    # η, B and λ when given: a sweep is told by which of them vary (hpo.trials.replay.curve_sweeps).
    parts = {c: _run_value(rows, c, run_id, source) for c in TAU_PARTS if c in rows and rows[c].notna().any()}
    if "tau" in rows and rows["tau"].notna().any():
        tau = _run_value(rows, "tau", run_id, source)
    elif len(parts) == len(TAU_PARTS):
        eta, batch, decay = (parts[c] for c in TAU_PARTS)
        # λ = 0 (plain Adam) is the τ = ∞ limit; the predictor fixes the τ term for it.
        tau = adamw_timescale(batch, eta, decay, total) if decay > 0 else math.inf
    else:
        raise CurveImportError(f"{source}: run {run_id}: column 'tau' is empty and there is no 'eta' (or 'lr'), "
                               "'batch_size' and 'weight_decay' to derive it from; give one or the other")
    pos = _numbers(rows, position, run_id, source)
    if position == "step":
        pos = pos * _run_value(rows, "batch_size", run_id, source)
    t_hat = pos / total if position != "train_fraction" else pos
    back = np.flatnonzero(np.diff(t_hat) < 0)  # in the file's order, checked after duplicates below
    loss = _numbers(rows, "loss", run_id, source)
    order = np.argsort(t_hat, kind="stable")
    t_hat, loss = t_hat[order], loss[order]
    if np.isnan(t_hat).any():
        raise CurveImportError(f"{source}: run {run_id}: column '{position}' has empty values")
    marks = _change_points(rows.iloc[order], t_hat, run_id, source)
    schedule = _schedule(name, optional, rows.iloc[order], t_hat, run_id, source)
    if np.any(np.diff(t_hat) == 0):
        raise CurveImportError(f"{source}: run {run_id}: duplicate positions in column '{position}'")
    if back.size:  # rows out of training order (a resumed run's log appended after its later points?)
        raw = pd.to_numeric(rows[position], errors="coerce").to_numpy(dtype=float)
        i = int(back[0])
        raise CurveImportError(f"{source}: run {run_id}: column '{position}' decreases within the run "
                               f"({raw[i]:.6g} then {raw[i + 1]:.6g}); a run's rows must be in training order "
                               "(drop the points logged after the checkpoint a resume went back to)")
    if t_hat[0] < -T_HAT_SLACK or t_hat[-1] > 1.0 + 1e-6:
        raise CurveImportError(
            f"{source}: run {run_id}: positions reach t̂ = {t_hat[-1]:.4g} (range {t_hat[0]:.4g}–{t_hat[-1]:.4g}); "
            + (f"t̂ = {position}/D must lie in [0, 1] with D = {total:.6g} tokens (check total_tokens, TPP, n_params)"
               if position != "train_fraction" else "'train_fraction' must lie in [0, 1]"))
    t_hat = np.clip(t_hat, 0.0, 1.0)
    finite = np.isfinite(loss)
    if not finite.all():
        first = float(t_hat[int(np.argmin(finite))])
        return None, f"run {run_id}: non-finite loss from t̂ = {first:.3g} on (diverged); left out"
    if np.any(loss <= 0):
        raise CurveImportError(f"{source}: run {run_id}: column 'loss' must be > 0")
    if np.any(loss < MIN_LOSS):
        worst = int(np.argmin(loss))
        raise CurveImportError(f"{source}: run {run_id}: column 'loss' is {loss[worst]:.3g} at t̂ = {t_hat[worst]:.3g}; "
                               f"losses must be at least {MIN_LOSS:g} (an underflow or a unit error?)")
    if np.any(loss > MAX_LOSS):
        worst = int(np.argmax(loss))
        raise CurveImportError(f"{source}: run {run_id}: column 'loss' is {loss[worst]:.3g} at t̂ = {t_hat[worst]:.3g}; "
                               f"losses must be at most {MAX_LOSS:g} (an overflow or a unit error?)")
    keep = t_hat > 0  # t̂ = 0 is before any step: no loss yet to normalise
    t_hat, loss, tokens = t_hat[keep], loss[keep], t_hat[keep] * total
    if t_hat.size < MIN_POINTS:
        return None, f"run {run_id}: only {t_hat.size} points (need {MIN_POINTS}); left out"
    if complete_only and not reaches_end(t_hat):
        return None, f"run {run_id}: ends at t̂ = {t_hat[-1]:.3g}, before the end of training; left out"
    if smoothing_fraction:
        loss = smooth_loss(tokens, loss, window_tokens=smoothing_fraction * total)
    meta = {"name": run_id, "n_params": n_params, "tokens_per_param": tpp, "total_tokens": total,
            **({"restarts": [float(x) for x in marks]} if marks else {}), **parts,
            **{k: (v.item() if hasattr(v, "item") else v) for k, v in optional.items()}}
    return Curve(t_hat, loss, Controls(tau, tpp, schedule, n_params), meta), ""


def _schedule(name: str, optional: dict[str, Any], rows: pd.DataFrame, t_hat: np.ndarray, run_id: str,
              source: str) -> Schedule:
    """A run's schedule from its per-run columns; ``logged``: from its ``logged_lr`` (rows in t̂
    order; points without a value are skipped), the warmup where it first peaks unless given."""
    fractions = {"final_fraction": float(optional.get("final_fraction", 0.0)),
                 "decay_shape": str(optional.get("decay_shape", "linear"))}
    try:
        if name != "logged":
            return Schedule(name, float(optional.get("warmup_fraction", 0.1)),  # type: ignore[arg-type]
                            float(optional.get("decay_fraction", 0.2)), **fractions)  # type: ignore[arg-type]
        if LOGGED_LR not in rows or rows[LOGGED_LR].isna().all():
            raise CurveImportError(f"{source}: run {run_id}: column '{LOGGED_LR}' is "
                                   f"{'missing' if LOGGED_LR not in rows else 'empty'}; a 'logged' schedule is read "
                                   "from it (the LR in force at each point)")
        lr = _numbers(rows, LOGGED_LR, run_id, source)
        known = ~np.isnan(lr)
        knots, values = np.clip(t_hat[known], 0.0, 1.0), lr[known]
        warmup = (float(optional["warmup_fraction"]) if "warmup_fraction" in optional
                  else logged_warmup(knots, values) if values.size and values.max() > 0 else 0.0)
        return Schedule("logged", warmup, points=(tuple(knots), tuple(values)))
    except CurveImportError:
        raise
    except ValueError as exc:
        raise CurveImportError(f"{source}: run {run_id}: "
                               + (f"column '{LOGGED_LR}': " if name == "logged" else "") + str(exc)) from None


def _change_points(rows: pd.DataFrame, t_hat: np.ndarray, run_id: str, source: str) -> list[float]:
    """t̂ of the marked restarts (``restart`` truthy: the first point after a resume) and of
    the points where ``micro_batch_size`` changes (rows in t̂ order): the monitor's graces."""
    marks: list[float] = []
    if "restart" in rows:
        flags = pd.to_numeric(rows["restart"].replace({"true": 1, "True": 1, "false": 0, "False": 0}),
                              errors="coerce").fillna(0).to_numpy(dtype=float)
        marks += [float(t) for t, f in zip(t_hat, flags) if f]
    if "micro_batch_size" in rows and rows["micro_batch_size"].notna().any():
        micro = _numbers(rows, "micro_batch_size", run_id, source)
        known = ~np.isnan(micro)
        t_known, m_known = t_hat[known], micro[known]
        marks += [float(t) for t, a, b in zip(t_known[1:], m_known[:-1], m_known[1:]) if a != b]
    return sorted(set(marks))


def load_mlflow_curves(experiment_id: str, *, tracking_uri: Optional[str] = None, metric: str = "loss",
                       smoothing_fraction: float = 0.0, complete_only: bool = True,
                       filter_string: Optional[str] = None) -> ImportedCurves:
    """Curves from every run of an MLflow experiment that logged ``metric`` (and matches
    ``filter_string``, an MLflow run filter: ``hpo monitor --job`` reads one sweep's trials).

    Per-run values come from the run's params (the file's column names; our sweeps' child runs
    log them, ``hpo.tracking.runs.TRIAL_PARAMS``); the loss from the metric history; the position
    from the run's ``train_fraction`` history at the same steps when it has one, else the
    MLflow step is the optimizer step. A step logged twice (a resumed trial) keeps its last
    value. Runs without the metric (a sweep's parent run) are skipped, with a note when they
    carry params. The rows then go through :func:`curves_from_frame`, so validation is
    identical; the run id is the MLflow run id, its run name goes to ``meta["run_name"]``.
    """
    uri = _existing_store(tracking_uri)
    source = f"mlflow:{strip_credentials(uri)}#{experiment_id}"
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=use_credentials(uri))
    try:
        experiment = client.get_experiment(str(experiment_id))
    except MlflowException:
        experiment = None
    if experiment is None:
        raise CurveImportError(f"{source}: no MLflow experiment with id {experiment_id!r}")
    frames, notes, skipped = [], [], 0
    token = None
    while True:
        page = client.search_runs([str(experiment_id)], filter_string=filter_string or "", max_results=500,
                                  page_token=token)
        for run in page:
            frame, note = _mlflow_run_frame(client, run, metric)
            if frame is None:
                skipped += bool(run.data.params)
                continue
            frames.append(frame)
            notes += [note] if note else []
        token = page.token
        if not token:
            break
    if not frames:
        raise CurveImportError(f"{source}: no run of the experiment logged the metric {metric!r}")
    frame = pd.concat(frames, ignore_index=True)
    if "tau" in frame:  # a sweep that searched λ may log no finite τ: derive it for those runs
        frame["tau"] = frame["tau"].where(~frame["tau"].isin(NO_VALUE))
    imported = curves_from_frame(frame, source=source, smoothing_fraction=smoothing_fraction,
                                 complete_only=complete_only)
    notes += imported.notes
    if skipped:
        notes.append(f"{skipped} run(s) with params but no {metric!r} history skipped (e.g. a sweep's parent run)")
    return ImportedCurves(imported.curves, notes, source)


def _existing_store(tracking_uri: Optional[str]) -> str:
    """The tracking URI to read from: the one given, else ``MLFLOW_TRACKING_URI``, else
    MLflow's default store in the working directory if it exists. Checked before MLflow is
    touched, so a wrong URI is one message and creates nothing (MLflow would create an
    empty ``mlflow.db`` in the working directory)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    field_name = "--tracking-uri" if tracking_uri else "MLFLOW_TRACKING_URI"
    if not uri:
        for default in ("mlflow.db", "mlruns"):
            if Path(default).exists():
                uri = f"sqlite:///{Path(default).resolve()}" if default == "mlflow.db" else str(Path(default).resolve())
                field_name = f"MLflow's default store ./{default}"
                break
        else:
            raise CurveImportError("--from-mlflow: no MLflow store to read: give --tracking-uri URI (or set "
                                   "MLFLOW_TRACKING_URI); there is no ./mlflow.db or ./mlruns here")
    try:
        check_tracking_uri(uri, field_name, must_exist=True)
    except TrackingUriError as exc:
        raise CurveImportError(str(exc)) from None
    return uri


def _mlflow_run_frame(client: Any, run: Any, metric: str) -> tuple[Optional[pd.DataFrame], str]:
    """One MLflow run as long-format rows (None when it has no ``metric`` history) and a note
    when repeated steps were collapsed to their last logged value."""
    run_id = run.info.run_id
    history = client.get_metric_history(run_id, metric)
    if not history:
        return None, ""
    latest = {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}
    steps = sorted(latest)
    frame = pd.DataFrame({"run_id": run_id, "loss": [latest[s] for s in steps]})
    fractions = {m.step: m.value for m in sorted(client.get_metric_history(run_id, "train_fraction"),
                                                 key=lambda m: m.timestamp)}
    if fractions and all(s in fractions for s in steps):
        frame["train_fraction"] = [fractions[s] for s in steps]
    else:
        frame["step"] = steps
    for key, value in run.data.params.items():
        frame[ALIASES.get(key, key)] = value
    frame["run_name"] = run.data.tags.get("mlflow.runName", "")
    repeated = len(history) - len(steps)
    note = (f"run {run_id}: {repeated} repeated step(s) in the {metric!r} history (a resumed run?); "
            "the last value logged at each step kept") if repeated else ""
    return frame, note
