"""``hpo monitor``: the collapse-residual monitor (``predictors.monitor``) on any runs' curves.

Reads curves in the format ``hpo calibrate --from-curves`` reads (``hpo.curve_import``; runs
still in progress included), takes each run's reference (the predictor's ℓ̂ for its controls,
or with ``--reference`` the reference curves of matching controls, the paper's way) and the
predictor's calibrated noise band, and reports per run: ok, aligning (not past the alignment
window yet), alarm since t̂, or no reference. Optionally writes one residual plot per run.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from hpo.errors import InputError
from predictors import Predictor
from predictors.curves import Curve, controls_with_size
from predictors.monitor import MonitorResult, NoiseBand, monitor_curve
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


def monitor_runs(curves: Sequence[Curve], predictor: Predictor,
                 references: Optional[ReferenceCurves] = None) -> list[tuple[Curve, Optional[MonitorResult], dict]]:
    """Each run's residual and verdict, and its JSON row."""
    band = predictor.monitor_band
    out = []
    for curve in curves:
        controls = controls_with_size(curve)
        ref, words = reference_for(curve, predictor, references)
        restarts = list(curve.meta.get("restarts") or [])
        row: dict[str, Any] = {"run_id": str(curve.meta.get("name", "")), "alarm": False,
                               "first_alarm_train_fraction": None, "status": "no reference",
                               "exceed_since_train_fraction": None, "direction": None,
                               "last_train_fraction": float(curve.t_hat[-1]), "last_residual": None,
                               "aligned_final_loss": None, "reference": words, "restarts": restarts}
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


def plot_residuals(runs: Sequence[tuple[Curve, Optional[MonitorResult], dict]], band: NoiseBand,
                   directory: Path) -> list[Path]:
    """One PNG per run: r(t̂) in %, the band c ± z·σ, the alignment window, restarts and the alarm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpo.overrides import check_safe_name

    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=80)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.15)  # fixed: tight_layout per run is slow
    grid = np.linspace(0.0, 1.0, 201)
    paths = []
    for curve, result, row in runs:
        if result is None or result.status == "aligning":
            continue
        ax.clear()
        after = grid[grid >= result.window[1]]
        center, scale = band.at(after)
        z = band.rule.z
        ax.fill_between(100 * after, 100 * (center - z * scale), 100 * (center + z * scale), color="0.88",
                        label=f"band c ± {z:g}σ ({band.n_curves} clean runs)")
        ax.axvspan(100 * result.window[0], 100 * result.window[1], color="tab:blue", alpha=0.08,
                   label="alignment window")
        ax.plot(100 * result.t_hat, 100 * result.residual, color="k", lw=1.0, label="residual r")
        for t in row["restarts"]:
            ax.axvline(100 * t, color="tab:green", ls=":", lw=1)
        if result.alarm:
            ax.axvline(100 * result.first_alarm, color="tab:red", lw=1.5, label=f"alarm t̂ = {result.first_alarm:.2f}")
        ax.axhline(0.0, color="0.5", lw=0.5)
        ax.set_xlim(0, 100)
        # The warmup's residual (not judged) would squash the axis: scale to the judged part and the band.
        seen = result.residual[result.t_hat >= result.window[0]]
        lo = min(float(np.min(seen)), float(np.min(center - z * scale)))
        hi = max(float(np.max(seen)), float(np.max(center + z * scale)))
        pad = 0.1 * (hi - lo) + 1e-4
        ax.set_ylim(100 * (lo - pad), 100 * (hi + pad))
        ax.set_xlabel("training fraction t̂ (%)")
        ax.set_ylabel("r = L/(L̂(T)·ℓ_ref) − 1 (%)")
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
