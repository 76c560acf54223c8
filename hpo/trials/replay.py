"""Replay banked loss curves through Ray Tune, and score early-stopping methods on them.

``ReplayTrainable`` is a Ray Tune class trainable that plays back one curve of the curve bank
(``hpo.trials.curve_bank``) with the same report contract as the real trainer (``docs/design.md``,
``hpo.trials.trainable.CollapseTrainable``): one bank point per Tune iteration, as fast as Tune
takes them, ``done=True`` on the last point. Any scheduler (``CollapseScheduler``, Ray's ASHA
or median stopping rule) can then be run on real curves in seconds instead of hours, and its
pick compared with the true best of the sweep, which the bank knows.

Usage::

    trainable = tune.with_parameters(ReplayTrainable, bank_path="configs/calibration/default_bank.parquet")
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                       param_space={"run_id": tune.grid_search(run_ids)}, ...)

or :func:`replay_sweep`, which does the above and returns the t̂ each trial reached.

The pure scoring logic (no Ray) lives here too, so tests and the benchmark
(``benchmarks/decisions.py``) share it:

* :func:`bank_sweeps` groups run ids into sweeps (by the ``sweep`` column and optional
  columns such as ``tokens_per_param``);
* :func:`true_finals` is each run's final loss (the last point of its curve);
* :func:`seed_noise` is the seed-to-seed std of the final loss where a configuration was run
  with several seeds;
* :func:`current_best_at` is the "current best at fraction f" rule (paper §5, "Results:
  tuning"), and
  :func:`outcome_from_reached` scores a scheduler from the t̂ its trials reached.

Conventions (the same for every method, so they compare):

* **compute** is Σ_trials t̂_reached / n_trials (1.0 = every run trained to the end; equal
  weights, which is exact inside a sweep of one model size and one TPP);
* the **pick** of a scheduler is, among the trials that reached t̂ = 1, the one with the lowest
  final loss (what a user of the sweep would choose); "current best at f" picks the lowest
  loss at the first point with t̂ ≥ f and then trains only that run to the end:
  compute = (f·n + (1 − f))/n, with f the t̂ of that point;
* **regret** = final loss of the pick − the lowest final loss of the sweep (loss units, ≥ 0);
* a pick whose regret is within the seed noise (1 std of the final loss across seeds, when the
  bank has repeated seeds of some configuration of the sweep) counts as a **tie**.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from ray import tune

from predictors.curves import compute_fraction, is_finished
from hpo.trials.curve_bank import load_bank
from predictors import run_keys
from predictors.curves import rung_cut
from predictors.smoothing import final_loss

#: Keys every replayed result carries (the contract of docs/design.md plus our trainer's extras).
_REPLAYED_CONTROLS = run_keys.names(reported=True, banked=True)  # the table: predictors.run_keys
_POINT_KEYS = run_keys.names(point=True)
REPORT_KEYS = ("loss", "train_fraction", *_REPLAYED_CONTROLS, *(k for k in _POINT_KEYS if k != "train_fraction"),
               "diverged", "status", "run_id")
#: Run columns that identify a configuration (same values = same configuration, other seed).
CONFIG_COLUMNS = run_keys.names(config=True)

_INT_KEYS = run_keys.names(type=int) + run_keys.names(point=True, type=int)
_FLOAT_KEYS = run_keys.names(type=float) + run_keys.names(point=True, type=float)

# One bank per path per process (an actor replays many trials with reuse_actors=True).
_BANK_CACHE: dict[tuple[str, float], pd.DataFrame] = {}


def load_replay_bank(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The bank at ``path``, read once per process (re-read when the file changes)."""
    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such curve bank")
    key = (str(path), path.stat().st_mtime)
    frame = _BANK_CACHE.get(key)
    if frame is None:
        frame = load_bank(path)
        _BANK_CACHE.clear()
        _BANK_CACHE[key] = frame
    return frame


def _py(value: Any) -> Any:
    """numpy scalars → Python scalars (Ray results and JSON stay plain)."""
    return value.item() if isinstance(value, np.generic) else value


def run_points(frame: pd.DataFrame, run_id: str, loss_column: str = "smoothed_loss") -> list[dict[str, Any]]:
    """The results a replay of ``run_id`` reports, in order: one per bank point.

    Points with a non-finite ``loss_column`` or t̂ ≤ 0 are skipped (a NaN loss would read as
    a divergence to the scheduler; ``hpo.trials.curve_bank.bank_curves`` drops the same points). The
    last result carries ``done=True``; for a run banked as ``diverged`` it also carries
    ``diverged=True`` and ``loss`` NaN, as the real trainer reports a divergence.

    Raises ``KeyError`` for an unknown run and ``ValueError`` when no point is left.
    """
    rows = frame[frame["run_id"] == run_id]
    if not len(rows):
        raise KeyError(f"run {run_id!r} is not in the bank")
    if loss_column not in rows.columns:
        raise ValueError(f"loss column {loss_column!r} is not in the bank")
    rows = rows.sort_values("train_fraction", kind="stable")
    first = rows.iloc[0]
    status = str(first["status"])
    controls: dict[str, Any] = {"run_id": str(run_id), "status": status}
    for key in _REPLAYED_CONTROLS:
        value = _py(first[key])
        if key in _INT_KEYS:
            value = int(value) if value is not None and not pd.isna(value) else -1
        elif key in _FLOAT_KEYS:
            value = float(value) if value is not None else math.nan
        else:
            value = str(value)
        controls[key] = value
    loss = rows[loss_column].to_numpy(dtype=float)
    t_hat = rows["train_fraction"].to_numpy(dtype=float)
    keep = np.isfinite(loss) & (t_hat > 0)
    points: list[dict[str, Any]] = []
    columns = {c: rows[c].to_numpy() for c in _POINT_KEYS}
    for i in np.flatnonzero(keep):
        point = dict(controls)
        for c, values in columns.items():
            v = _py(values[i])
            point[c] = int(v) if c in _INT_KEYS else float(v)
        point["loss"] = float(loss[i])
        point["diverged"] = False
        points.append(point)
    if not points:
        raise ValueError(f"run {run_id!r}: no finite {loss_column!r} with t̂ > 0 to replay")
    if status == "diverged":
        points[-1]["diverged"] = True
        points[-1]["loss"] = math.nan
    points[-1]["done"] = True
    return points


#: The settings a sweep varies; runs that agree on everything else form one sweep.
SWEPT = ("eta", "batch_size", "weight_decay")


def curve_points(curve: Any, run_id: Optional[str] = None) -> list[dict[str, Any]]:
    """The results a replay of an imported curve (``predictors.Curve``, e.g. from
    ``hpo.calibration.log_import``) reports, as :func:`run_points` does for a bank run: the run's
    controls (``Controls.to_dict``), η/B/λ where the import knew them, and one point a result.

    A complete curve's last point stands for the end of training (``predictors.curves.reaches_end``:
    it is within one logging interval of it), so it reports t̂ = 1 and ``done``; the others report
    their own t̂."""
    from predictors.curves import reaches_end

    run_id = str(run_id if run_id is not None else curve.meta.get("name"))
    base = {"run_id": run_id, "status": "completed", **curve.controls.to_dict(),
            **{k: float(curve.meta[k]) for k in SWEPT if curve.meta.get(k) is not None},
            **{k: curve.meta[k] for k in ("total_tokens",) if curve.meta.get(k) is not None}}
    t_hat, loss = np.asarray(curve.t_hat, dtype=float), np.asarray(curve.loss, dtype=float)
    points = [{**base, "train_fraction": float(t), "loss": float(y), "diverged": False} for t, y in zip(t_hat, loss)]
    if points and reaches_end(t_hat):
        points[-1]["train_fraction"] = 1.0
    if points:
        points[-1]["done"] = True
    return points


def curve_sweeps(curves: Sequence[Any], swept: Sequence[str] = SWEPT, min_arms: int = 2,
                 digits: int = 3) -> tuple[dict[str, list[Any]], list[str]]:
    """Group curves into sweeps: runs that differ only in the ``swept`` settings (η, B, λ) and agree
    on everything else that shapes a curve (corpus, experiment, model size N, tokens D, the schedule
    with its fractions, the other settings), each group with at least ``min_arms`` runs. Values are compared
    to ``digits`` significant digits (a schedule read from a logged LR differs in the last bits).

    Returns ({sweep name: its curves, by η}, the runs that form no sweep, in words). A sweep is named
    by what it shares: ``<corpus> N=<N> D=<tokens> <schedule>``."""
    def rounded(value: Any) -> Any:
        return float(f"{value:.{digits}g}") if isinstance(value, (int, float)) and math.isfinite(value) else value

    groups: dict[tuple[Any, ...], list[Any]] = {}
    for curve in curves:
        shape = {k: v for k, v in curve.controls.to_dict().items() if k not in ("tau",)}
        fixed = {k: curve.meta.get(k) for k in (*SWEPT, "corpus", "project", "total_tokens") if k not in swept}
        # Fractions of training (warmup, decay, the LR floor) to 0.01 absolute: a floor of 1e-7/1e-4
        # of the peak is still "to zero".
        key = tuple(sorted((k, round(float(v), 2) if k.endswith("_fraction") else
                            rounded(v) if not isinstance(v, (list, tuple)) else str(v))
                           for k, v in {**shape, **fixed}.items()))
        groups.setdefault(key, []).append(curve)
    sweeps, alone = {}, []
    for key, members in groups.items():
        members = sorted(members, key=lambda c: tuple(float(c.meta.get(k) or 0) for k in swept))
        if len(members) < min_arms:
            alone += [f"run {c.meta.get('name')}: no other run differs from it only in {'/'.join(swept)}"
                      for c in members]
            continue
        first = members[0]
        s = first.controls.schedule
        shape = s.name + (f" {s.decay_fraction:g}" if s.name == "wsd" else "")
        extra = {k: getattr(s, k) for k in ("decay_shape", "final_fraction") if hasattr(s, k)}
        if extra.get("decay_shape", "linear") != "linear":
            shape += f" {extra['decay_shape']}"
        if extra.get("final_fraction"):
            shape += f" to {extra['final_fraction']:.2g}"
        n_params = float(first.controls.n_params or 0)
        tokens = float(first.meta.get("total_tokens") or (first.meta.get("tokens_per_param") or 0) * n_params)
        # (a model under 1M parameters, trained on under 0.1B tokens, keeps two digits: N=0.1M D=2.01M)
        size = f"N={n_params / 1e6:.0f}M" if n_params >= 1e6 else f"N={n_params / 1e6:.2g}M"
        size += f" D={tokens / 1e9:.2f}B" if tokens >= 1e8 else f" D={tokens / 1e6:.3g}M"
        name = " ".join(x for x in (first.meta.get("corpus"), size, shape) if x)
        while name in sweeps:
            name += "'"
        sweeps[name] = members
    return dict(sorted(sweeps.items())), alone


class ReplayTrainable(tune.Trainable):
    """Replays one banked curve, one point per iteration, with the real trainer's report keys.

    Config: ``{"run_id": ...}``. The bank path comes through
    ``tune.with_parameters(ReplayTrainable, bank_path=..., loss_column="smoothed_loss")``
    (or, when constructed by hand outside Tune, a ``bank_path`` key in the config). The bank is
    read once per actor. ``loss`` is the bank's ``loss_column`` (the smoothed loss, as the
    scheduler sees it in a live sweep). PAUSE/resume continues at the next point
    (dict checkpoints); ``reset_config`` switches an actor to another run (``reuse_actors``).
    """

    def setup(
        self,
        config: dict[str, Any],
        bank_path: Optional[str] = None,
        loss_column: str = "smoothed_loss",
    ) -> None:
        self._bank_path = bank_path or config.get("bank_path")
        if not self._bank_path:
            raise ValueError("ReplayTrainable: pass bank_path through tune.with_parameters")
        self._loss_column = str(config.get("loss_column", loss_column))
        self._load_run(config)

    def _load_run(self, config: Mapping[str, Any]) -> None:
        if "run_id" not in config:
            raise ValueError("ReplayTrainable: the trial config needs a 'run_id'")
        self._run_id = str(config["run_id"])
        self._points = run_points(load_replay_bank(self._bank_path), self._run_id, self._loss_column)
        self._next = 0

    def step(self) -> dict[str, Any]:
        if self._next >= len(self._points):  # only after a checkpoint at the very end
            result = dict(self._points[-1])
        else:
            result = dict(self._points[self._next])
            self._next += 1
        return result

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._loss_column = str(new_config.get("loss_column", self._loss_column))
        self._load_run(new_config)
        return True

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"run_id": self._run_id, "next": self._next, "loss_column": self._loss_column}

    def load_checkpoint(self, checkpoint: Any) -> None:
        if not isinstance(checkpoint, dict) or checkpoint.get("run_id") != self._run_id:
            raise ValueError(f"ReplayTrainable: checkpoint {checkpoint!r} is not of run {self._run_id}")
        self._next = int(checkpoint["next"])


# ---------------------------------------------------------------------- bank views


def _completed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "completed"]


def _label(value: Any) -> str:
    value = _py(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def bank_sweeps(
    frame: pd.DataFrame,
    group_by: Sequence[str] = (),
    *,
    completed_only: bool = True,
) -> dict[str, list[str]]:
    """Run ids grouped into sweeps: by the ``sweep`` column, then by ``group_by`` columns.

    Keys read ``"<sweep>"`` or ``"<sweep>[tokens_per_param=20,seed=1]"``; run ids are sorted.
    E.g. a calibration bank grouped by ``("tokens_per_param", "seed")`` gives one τ sweep per
    TPP and seed. Only completed runs unless ``completed_only=False``.
    """
    missing = [c for c in group_by if c not in frame.columns]
    if missing:
        raise ValueError(f"group_by: the bank has no column(s) {missing}")
    if completed_only:
        frame = _completed(frame)
    runs = frame.drop_duplicates("run_id")
    keys = ["sweep", *[c for c in group_by if c != "sweep"]]
    out: dict[str, list[str]] = {}
    for values, rows in runs.groupby(keys, sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        name = str(values[0])
        if len(keys) > 1:
            name += "[" + ",".join(f"{k}={_label(v)}" for k, v in zip(keys[1:], values[1:])) + "]"
        out[name] = sorted(str(r) for r in rows["run_id"])
    return out


def true_finals(
    frame: pd.DataFrame,
    loss_column: str = "smoothed_loss",
    *,
    completed_only: bool = True,
) -> dict[str, float]:
    """Each run's final loss (``predictors.smoothing.final_loss`` of its ``loss_column``: the
    smoothed loss at t̂ = 1); runs that never reach t̂ = 1 with a finite loss are left out."""
    if completed_only:
        frame = _completed(frame)
    out: dict[str, float] = {}
    for run_id, rows in frame.groupby("run_id", sort=True):
        rows = rows.sort_values("train_fraction", kind="stable")
        value = final_loss(rows["train_fraction"].to_numpy(dtype=float), rows[loss_column].to_numpy(dtype=float))
        if value is not None:
            out[str(run_id)] = value
    return out


def loss_at(
    frame: pd.DataFrame, run_id: str, fraction: float, loss_column: str = "smoothed_loss"
) -> tuple[float, float]:
    """(t̂, loss) at the rung point of ``fraction`` (``predictors.curves.rung_cut``: the first
    replayed point with t̂ ≥ fraction) — what a trial stopped at that fraction has seen."""
    points = run_points(frame, run_id, loss_column)
    n = rung_cut([p["train_fraction"] for p in points], fraction)
    if n is None:
        raise ValueError(f"run {run_id!r} never reaches t̂ = {fraction:g}")
    return float(points[n - 1]["train_fraction"]), float(points[n - 1]["loss"])


@dataclass(frozen=True)
class SeedNoise:
    """Std (ddof=1) of the final loss across seeds, pooled over the repeated configurations."""

    std: Optional[float]
    n_configs: int  # configurations with ≥ 2 seeds
    n_runs: int  # runs in those configurations


def seed_noise(
    frame: pd.DataFrame,
    run_ids: Optional[Iterable[str]] = None,
    loss_column: str = "smoothed_loss",
    finals: Optional[Mapping[str, float]] = None,
) -> SeedNoise:
    """Seed noise of the final loss over the configurations of ``run_ids`` (default: all runs).

    A configuration is the run columns except run id, sweep, seeds, corpus hash and status
    (``CONFIG_COLUMNS``); repeats of a configuration anywhere in the bank count, even outside
    ``run_ids``. The pooled std is sqrt(mean of the per-configuration variances).
    ``std`` is None when no configuration has two seeds.
    """
    finals = dict(finals) if finals is not None else true_finals(frame, loss_column)
    runs = _completed(frame).drop_duplicates("run_id").set_index("run_id")
    runs = runs[runs.index.isin(list(finals))]
    if not len(runs):
        return SeedNoise(None, 0, 0)
    columns = [c for c in CONFIG_COLUMNS if c in runs.columns]
    keys = runs[columns].astype(str).agg("|".join, axis=1)
    wanted = set(keys[keys.index.isin([str(r) for r in run_ids])]) if run_ids is not None else set(keys)
    variances: list[float] = []
    n_runs = 0
    for key, ids in keys.groupby(keys).groups.items():
        if key not in wanted or len(ids) < 2:
            continue
        values = np.array([finals[str(i)] for i in ids], dtype=float)
        variances.append(float(np.var(values, ddof=1)))
        n_runs += len(ids)
    if not variances:
        return SeedNoise(None, 0, 0)
    return SeedNoise(float(math.sqrt(np.mean(variances))), len(variances), n_runs)


# ---------------------------------------------------------------------- scoring


@dataclass
class MethodOutcome:
    """One method on one sweep."""

    sweep: str
    method: str
    n_runs: int
    compute: float  # Σ t̂ reached / n (1 = the full sweep)
    pick: Optional[str]  # the chosen run id (None: nothing finished)
    pick_final: Optional[float]
    best: str  # the run with the lowest final loss
    best_final: float
    regret: Optional[float]  # pick_final − best_final
    picked_best: bool
    tie: Optional[bool]  # regret within the seed noise (None: no noise estimate)
    noise: Optional[float] = None
    reached: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    note: str = ""

    def row(self) -> dict[str, Any]:
        """A flat row for CSV/markdown (no per-trial detail)."""
        return {
            "sweep": self.sweep, "method": self.method, "n_runs": self.n_runs,
            "compute": self.compute, "pick": self.pick, "pick_final": self.pick_final,
            "best": self.best, "best_final": self.best_final, "regret": self.regret,
            "picked_best": self.picked_best, "tie": self.tie, "seed_noise": self.noise,
            "wall_s": self.wall_s, "note": self.note,
        }


def _best(finals: Mapping[str, float]) -> tuple[str, float]:
    run = min(sorted(finals), key=lambda r: finals[r])
    return run, float(finals[run])


def score_pick(
    sweep: str,
    method: str,
    pick: Optional[str],
    finals: Mapping[str, float],
    compute: float,
    noise: Optional[float] = None,
    reached: Optional[Mapping[str, float]] = None,
    note: str = "",
) -> MethodOutcome:
    """Regret, picked-best and tie of ``pick`` among the runs of ``finals`` (one sweep)."""
    if not finals:
        raise ValueError("score_pick: no runs with a final loss")
    best, best_final = _best(finals)
    if pick is None:
        return MethodOutcome(sweep, method, len(finals), compute, None, None, best, best_final, None,
                             False, None, noise, dict(reached or {}), note=note or "no trial finished")
    pick_final = float(finals[pick])
    regret = pick_final - best_final
    tie = None if noise is None else bool(regret <= noise + 1e-12)
    return MethodOutcome(sweep, method, len(finals), compute, pick, pick_final, best, best_final, regret,
                         pick == best or regret <= 0.0, tie, noise, dict(reached or {}), note=note)


def current_best_at(
    frame: pd.DataFrame,
    run_ids: Sequence[str],
    fraction: float,
    *,
    loss_column: str = "smoothed_loss",
    sweep: str = "",
    noise: Optional[float] = None,
    finals: Optional[Mapping[str, float]] = None,
) -> MethodOutcome:
    """"Current best at f": pick the lowest loss at the first point with t̂ ≥ f, finish only it.

    compute = (Σ_i t̂_i + (1 − t̂_pick))/n where t̂_i is the t̂ of the point read for run i
    (= (f·n + 1 − f)/n when every run has a point at exactly f). Ties in the loss at f go to
    the smaller run id.
    """
    all_finals = finals if finals is not None else true_finals(frame, loss_column)
    sweep_finals = {r: all_finals[r] for r in run_ids}
    seen = {r: loss_at(frame, r, fraction, loss_column) for r in sorted(run_ids)}
    pick = min(seen, key=lambda r: (seen[r][1], r))
    reached = {r: t for r, (t, _) in seen.items()}
    reached[pick] = 1.0
    return score_pick(sweep, f"current-best@{fraction:g}", pick, sweep_finals, compute_fraction(reached),
                      noise, reached)


def outcome_from_reached(
    sweep: str,
    method: str,
    reached: Mapping[str, float],
    finals: Mapping[str, float],
    noise: Optional[float] = None,
    note: str = "",
) -> MethodOutcome:
    """Score a scheduler from the t̂ each trial reached: compute = mean t̂; the pick is the
    finished trial (t̂ ≥ 1) with the lowest final loss."""
    sweep_finals = {r: finals[r] for r in reached}
    done = [r for r, t in reached.items() if is_finished(t)]
    pick = min(sorted(done), key=lambda r: sweep_finals[r]) if done else None
    return score_pick(sweep, method, pick, sweep_finals, compute_fraction(reached), noise, reached, note)


# ---------------------------------------------------------------------- Ray Tune


def replay_sweep(
    bank_path: str | os.PathLike[str],
    run_ids: Sequence[str],
    scheduler: Any,
    *,
    name: str = "replay",
    storage_path: Optional[str | os.PathLike[str]] = None,
    loss_column: str = "smoothed_loss",
    cpus_per_trial: float = 1,
    metric: str = "loss",
    mode: str = "min",
    callbacks: Sequence[Any] = (),
    quiet: bool = True,
) -> tuple[dict[str, float], list[str]]:
    """Run ``run_ids`` through Ray Tune as replayed trials under ``scheduler``.

    Ray must be initialised by the caller (once, for many sweeps). Concurrency comes from
    ``cpus_per_trial`` and the cluster's CPUs (no ``max_concurrent_trials``: paused trials
    count as live and would starve a synchronous rung). Trials are created in ``run_ids``
    order. ``storage_path`` defaults to a temporary directory, removed afterwards. ``quiet`` hides Tune's
    console output (its experiment box, INFO lines) and, for speed, its per-result JSON/CSV
    loggers, for the duration of the run only.

    Returns ({run_id: the largest t̂ the trial reported}, [error messages]).
    """
    from hpo.trials.trainable import short_trial_dirname

    reached: dict[str, float] = {r: 0.0 for r in run_ids}

    class _Reached(tune.Callback):
        def _see(self, trial: Any, result: Optional[Mapping[str, Any]]) -> None:
            if result and "train_fraction" in result:
                run = str(trial.config["run_id"])
                reached[run] = max(reached[run], float(result["train_fraction"]))

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._see(trial, result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._see(trial, trial.last_result)

    scratch = tempfile.TemporaryDirectory(prefix="replay-") if storage_path is None else None
    storage = Path(storage_path) if storage_path is not None else Path(scratch.name)  # type: ignore[union-attr]
    trainable = tune.with_resources(
        tune.with_parameters(ReplayTrainable, bank_path=str(Path(bank_path).resolve()), loss_column=loss_column),
        {"cpu": cpus_per_trial},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"run_id": tune.grid_search(list(run_ids))},
        tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler, reuse_actors=True,
                                    trial_dirname_creator=short_trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=str(storage.resolve()), verbose=0,
                                  callbacks=[_Reached(), *callbacks],
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    try:
        with _quiet_tune(quiet):
            grid = tuner.fit()
        errors = [f"{type(e).__name__}: {e}" for e in getattr(grid, "errors", [])]
        for result in grid:  # also covers trials whose last result no callback saw
            run = str((result.config or {}).get("run_id", ""))
            t = (result.metrics or {}).get("train_fraction")
            if run in reached and t is not None:
                reached[run] = max(reached[run], float(t))
    finally:
        if scratch is not None:
            scratch.cleanup()
    return reached, errors


@contextlib.contextmanager
def _quiet_tune(quiet: bool) -> Iterator[None]:
    """Silence Tune's driver output and skip its per-result file loggers, then restore both."""
    if not quiet:
        yield
        return
    key = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
    old_env = os.environ.get(key)
    os.environ[key] = "1"
    tune_logger = logging.getLogger("ray.tune")
    old_level = tune_logger.level
    tune_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        tune_logger.setLevel(old_level)
        if old_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old_env

