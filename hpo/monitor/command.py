"""``hpo monitor``: the collapse-residual monitor (``predictors.monitor``) on any runs' curves.

Reads curves in the format ``hpo calibrate --from-curves`` reads (``hpo.calibration.curve_import``; runs
still in progress included), takes each run's reference (the predictor's ℓ̂ for its controls,
or with ``--reference`` the reference curves of matching controls, the paper's way) and the
predictor's calibrated noise band, and reports per run: ok, aligning (not past the alignment
window yet), alarm since t̂, or no reference. Optionally writes one residual plot per run.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hpo.common.errors import InputError
from predictors import Predictor
from predictors.curves import Curve, controls_with_size
from predictors.monitor import MonitorResult, NoiseBand, monitor_curve, pair_changes, pair_contrasts, scaled_band
from predictors.references import ReferenceCurves


def reference_for(curve: Curve, predictor: Predictor, references: Optional[ReferenceCurves]
                  ) -> tuple[Any, str]:
    """(the reference ``monitor_curve`` takes, in words) for one run; (None, why) when
    ``references`` hold no curve of matching controls."""
    controls = controls_with_size(curve)
    if references is None:
        return predictor, predictor.curve_source(controls)
    ell, why = references.normalized(curve.t_hat, controls, predictor._surrogate_ell)
    if ell is None:
        return None, why
    return (curve.t_hat, ell), why


@dataclass(frozen=True)
class ReferenceBands:
    """The bands of reference mode (``hpo monitor --reference``): the variation the reference
    itself brings, not the predictor's.

    ``stored``: the predictor's reference-mode band (pairs of calibration runs of the same
    controls and different seeds), or its predictor-mode band where it has none. ``measured``:
    that band's shape rescaled to the spread of the user's own reference runs (every pair of
    them with the same controls, N included, one judged against the other:
    ``predictors.monitor.scaled_band``, its h raised for the few runs the spread is measured on),
    or None when no two reference runs share controls.
    A run whose controls ≥ 2 reference runs match is judged with ``measured``, others with
    ``stored``."""

    stored: NoiseBand
    measured: Optional[NoiseBand]
    references: ReferenceCurves

    @classmethod
    def of(cls, predictor: Predictor, runs: Sequence[Curve], references: ReferenceCurves) -> "ReferenceBands":
        stored = predictor.monitor_band.for_reference
        changes = pair_changes(runs, rule=stored.rule, window=stored.window)
        measured = None
        if changes.shape[0]:
            measured = scaled_band(stored, changes, contrasts=pair_contrasts(runs),
                                   source=f"{changes.shape[0]} ordered pair(s) of the reference runs "
                                          f"(spread scaled onto: {stored.source or 'the stored band'})")
        return cls(stored, measured, references)

    def for_run(self, controls: Any) -> tuple[NoiseBand, str]:
        """(band, in words) for a run with these controls."""
        runs = sum(r.n_curves for r in self.references.curves if r.matches(controls))
        if runs >= 2 and self.measured is not None:
            return self.measured, f"the spread of the reference runs ({runs} of these controls)"
        return self.stored, f"stored reference-mode band ({self.stored.source or 'uncalibrated'})"


def monitor_runs(curves: Sequence[Curve], predictor: Predictor, references: Optional[ReferenceCurves] = None,
                 bands: Optional[ReferenceBands] = None) -> list[tuple[Curve, Optional[MonitorResult], dict]]:
    """Each run's residual and verdict, and its JSON row. With ``references`` each run is judged
    with ``bands`` (reference mode; the stored reference-mode band where not given)."""
    out = []
    for curve in curves:
        controls = controls_with_size(curve)
        ref, words = reference_for(curve, predictor, references)
        if references is None:
            band, band_words = predictor.monitor_band, f"predictor mode ({predictor.monitor_band.source})"
        elif bands is not None:
            band, band_words = bands.for_run(controls)
        else:
            band = predictor.monitor_band.for_reference
            band_words = f"stored reference-mode band ({band.source or 'uncalibrated'})"
        restarts = list(curve.meta.get("restarts") or [])
        row: dict[str, Any] = {"run_id": str(curve.meta.get("name", "")), "alarm": False,
                               "first_alarm_train_fraction": None, "status": "no reference",
                               "exceed_since_train_fraction": None, "direction": None,
                               "last_train_fraction": float(curve.t_hat[-1]), "last_residual": None,
                               "aligned_final_loss": None, "reference": words, "band": band_words,
                               "restarts": restarts}
        result = None
        if ref is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # N missing: said in "reference"
                    result = monitor_curve(curve.t_hat, curve.loss, ref, controls, band=band, restarts=restarts)
            except ValueError as exc:
                raise InputError(f"run {row['run_id']}: {exc}") from None
            row.update(status=result.status, alarm=result.alarm, first_alarm_train_fraction=result.first_alarm,
                       exceed_since_train_fraction=result.exceed_since, direction=result.direction,
                       last_residual=result.last_residual,
                       aligned_final_loss=None if math.isnan(result.final_loss) else result.final_loss)
        out.append((curve, result, row))
    return out


@dataclass
class CurveSource:
    """Where ``hpo monitor`` reads its runs: a curve file, an MLflow experiment, or the trials of
    a sweep submitted as a Ray Job (its child runs, found as ``hpo status`` finds the sweep)."""

    curves: Optional[str] = None
    experiment: Optional[str] = None
    job: Optional[str] = None
    tracking_uri: Optional[str] = None
    address: Optional[str] = None
    metric: str = "loss"
    smoothing_fraction: float = 0.0
    _job_run: Optional[tuple[Any, str, str]] = None  # (MLflow client, URI, experiment) once resolved

    def __post_init__(self) -> None:
        if sum(bool(x) for x in (self.curves, self.experiment, self.job)) != 1:
            raise InputError("monitor: give CURVES (a curve file), --from-mlflow EXPERIMENT_ID or --job JOB_ID, "
                             "one of them")

    def _parent(self) -> Optional[Any]:
        """The job's parent run (None before the sweep has made it)."""
        from hpo.tracking.cluster import connect, job_info, tracking_client
        from hpo.tracking.runs import find_job_run

        if self._job_run is None:
            meta = job_info(connect(self.address), str(self.job)).metadata or {}
            if not meta.get("experiment"):
                raise InputError(f"--job: {self.job} is not a sweep submitted with hpo submit")
            uri = self.tracking_uri or meta.get("tracking_uri")
            self._job_run = (tracking_client(self.tracking_uri, meta.get("tracking_uri")), str(uri), meta["experiment"])
        return find_job_run(self._job_run[0], self._job_run[2], str(self.job))

    def read(self) -> tuple[Optional[Any], bool]:
        """(``ImportedCurves`` or None while a job has no trial curve yet, whether every run has
        ended: a file's runs at t̂ = 1, MLflow runs no longer RUNNING)."""
        from hpo.calibration.curve_import import CurveImportError, load_curves_file, load_mlflow_curves

        try:
            if self.curves:
                imported = load_curves_file(self.curves, smoothing_fraction=self.smoothing_fraction,
                                            complete_only=False)
                return imported, all(c.t_hat[-1] >= 1.0 - 1e-6 for c in imported.curves)
            if self.experiment:
                imported = load_mlflow_curves(self.experiment, tracking_uri=self.tracking_uri, metric=self.metric,
                                              smoothing_fraction=self.smoothing_fraction, complete_only=False)
                return imported, _all_ended(imported, self.tracking_uri)
            parent = self._parent()
            if parent is None:
                return None, False
            from hpo.tracking.runs import filter_value

            assert self._job_run is not None
            children = f"tags.`mlflow.parentRunId` = {filter_value(parent.info.run_id, 'run id')}"
            try:
                imported = load_mlflow_curves(parent.info.experiment_id, tracking_uri=self._job_run[1],
                                              metric=self.metric, smoothing_fraction=self.smoothing_fraction,
                                              complete_only=False, filter_string=children)
            except CurveImportError as exc:
                if "logged the metric" not in str(exc):
                    raise
                imported = None  # no trial has reported yet
            assert self._job_run is not None
            ended = self._job_run[0].get_run(parent.info.run_id).info.status not in ("RUNNING", "SCHEDULED")
            return imported, ended
        except CurveImportError as exc:
            raise InputError(str(exc)) from None


def _all_ended(imported: Any, tracking_uri: Optional[str]) -> bool:
    """Whether every MLflow run of ``imported`` has ended (its status is no longer RUNNING)."""
    import os

    from mlflow.tracking import MlflowClient

    from hpo.tracking.uri import use_credentials

    # The URI given (a database URI keeps its password), else the default store the import found.
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or imported.source.split(":", 1)[1].rsplit("#", 1)[0]
    client = MlflowClient(tracking_uri=use_credentials(uri))
    return all(client.get_run(str(c.meta["name"])).info.status not in ("RUNNING", "SCHEDULED")
               for c in imported.curves)


def follow(source: CurveSource, predictor: Predictor, references: Optional[ReferenceCurves], *,
           every: float, say: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
           max_polls: Optional[int] = None, bands: Optional[ReferenceBands] = None) -> dict[str, dict]:
    """``hpo monitor --follow``: re-read the runs every ``every`` seconds until every run has
    ended, printing a run's line only when its status changes (new, aligning → ok → ALARM,
    ended). Returns the last row of each run."""
    shown: dict[str, tuple] = {}
    rows: dict[str, dict] = {}
    polls = 0
    while True:
        imported, ended = source.read()
        for _, _, row in monitor_runs(imported.curves if imported is not None else [], predictor, references, bands):
            rows[row["run_id"]] = row
            key = (row["status"], row["first_alarm_train_fraction"])
            if shown.get(row["run_id"]) != key:
                shown[row["run_id"]] = key
                say(f"{row['run_id']}  {status_line(row)}")
        polls += 1
        if ended or (max_polls is not None and polls >= max_polls):
            alarms = sum(r["alarm"] for r in rows.values())
            say(f"{'all runs ended' if ended else 'stopped following'}: {alarms} alarm(s) in {len(rows)} run(s)")
            return rows
        sleep(every)


def status_line(row: dict) -> str:
    """One run's status in words."""
    if row["status"] == "alarm":
        return (f"ALARM since t̂ = {row['first_alarm_train_fraction']:.3f} (residual {row['direction']} its band "
                f"from t̂ = {row['exceed_since_train_fraction']:.3f})")
    if row["status"] == "ok":
        return f"ok up to t̂ = {row['last_train_fraction']:.3f} (residual {100 * row['last_residual']:+.2f}%)"
    if row["status"] == "aligning":
        return f"aligning (t̂ = {row['last_train_fraction']:.3f}; judged after the alignment window)"
    return f"no reference ({row['reference']})"


#: The band drawn around the change d is c ± this many σ (for the eye; the alarm is the GLR's).
PLOT_SIGMAS = 3.0


def plot_residuals(runs: Sequence[tuple[Curve, Optional[MonitorResult], dict]],
                   band_for: Callable[[Curve], NoiseBand], directory: Path) -> list[Path]:
    """One PNG per run: r(t̂) and its change d in %, the band c ± 3σ of d (``band_for(curve)``),
    the alignment window, restarts and the alarm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpo.common.overrides import check_safe_name

    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=80)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.15)  # fixed: tight_layout per run is slow
    grid = np.linspace(0.0, 1.0, 201)
    paths = []
    for curve, result, row in runs:
        if result is None or result.status == "aligning":
            continue
        ax.clear()
        band = band_for(curve)
        after = grid[grid >= result.window[1]]
        center, scale = band.at(after)
        z = PLOT_SIGMAS
        ax.fill_between(100 * after, 100 * (center - z * scale), 100 * (center + z * scale), color="0.88",
                        label=f"band of d: c ± {z:g}σ ({band.n_curves} clean runs or pairs)")
        ax.axvspan(100 * result.window[0], 100 * result.window[1], color="tab:blue", alpha=0.08,
                   label="alignment window")
        ax.plot(100 * result.t_hat, 100 * result.residual, color="0.55", lw=0.8, label="residual r")
        ax.plot(100 * result.t_hat, 100 * result.change, color="k", lw=1.2, label="its change d after the window")
        for t in row["restarts"]:
            ax.axvline(100 * t, color="tab:green", ls=":", lw=1)
        if result.alarm:
            ax.axvline(100 * result.first_alarm, color="tab:red", lw=1.5, label=f"alarm t̂ = {result.first_alarm:.2f}")
        ax.axhline(0.0, color="0.5", lw=0.5)
        ax.set_xlim(0, 100)
        # The warmup's residual (not judged) would squash the axis: scale to the judged part and the band.
        seen = np.concatenate([result.residual[result.t_hat >= result.window[0]],
                               result.change[np.isfinite(result.change)]])
        lo = min(float(np.min(seen)), float(np.min(center - z * scale)))
        hi = max(float(np.max(seen)), float(np.max(center + z * scale)))
        pad = 0.1 * (hi - lo) + 1e-4
        ax.set_ylim(100 * (lo - pad), 100 * (hi + pad))
        ax.set_xlabel("training fraction t̂ (%)")
        ax.set_ylabel("r = L/(L̂(T)·ℓ_ref) − 1, d (%)")
        ax.set_title(f"{row['run_id']}: {row['status']}", fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
        try:
            name = check_safe_name(row["run_id"])
        except ValueError:
            name = f"run{len(paths)}"
        path = directory / f"residual_{name}.png"
        fig.savefig(path)
        paths.append(path)
    plt.close(fig)
    return paths
