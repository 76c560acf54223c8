"""Aligning a (partial) loss curve to a normalised curve: the divisor L(T) (paper §5 step 5).

The paper picks the divisor L(T) that "maximally aligns" L(t̂)/L(T) with the same segment of
the predicted curve ℓ̂; the objective and the segment start are not stated. Our choices and the
study behind them are in docs/predictor.md. Objectives (``c`` is the divisor, the predicted
final loss):

* ``"log"``: log c = mean(log L_i − log ℓ̂_i)  (least squares of the log ratio; the default)
* ``"l2"``:  c minimises Σ (L_i/c − ℓ̂_i)²  →  c = Σ L_i² / Σ L_i ℓ̂_i
* ``"l1"``:  c minimises Σ |L_i/c − ℓ̂_i|   (the paper's MAE metric; a weighted median)

The segment is [max(min_start, start_ratio·s), s] where s is the last observed t̂ (default
[0.8·s, s]); it is extended backwards to hold at least ``min_points`` points.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

from predictors import equations
from predictors.controls import Controls
from predictors.normalize import check_curve, check_t_hat

Objective = Literal["log", "l2", "l1"]
OBJECTIVES: tuple[str, ...] = ("log", "l2", "l1")

# Paper §4 "Collapse results" (docs/paper.md): early-align over 25–50% of training.
EARLY_ALIGN_WINDOW = (0.25, 0.5)


@dataclass(frozen=True)
class AlignSettings:
    """How ``Predictor.predict_final`` aligns a partial curve (see docs/predictor.md).

    Args:
        objective: ``"log"``, ``"l2"`` or ``"l1"`` (module docstring).
        start_ratio: the segment starts at ``start_ratio·s``; 0 uses everything from
            ``min_start``, 1 only the last points (the L(s)/ℓ̂(s) rule).
        min_start: the segment never starts before this t̂.
        min_points: fewest points in a segment (it is extended backwards to reach this); a
            curve with fewer observed points is an error.
    """

    objective: Objective = "log"
    start_ratio: float = 0.8
    min_start: float = 0.0
    min_points: int = 3

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: {self.objective!r} is not one of {OBJECTIVES}")
        if not (isinstance(self.start_ratio, (int, float)) and 0.0 <= self.start_ratio <= 1.0):
            raise ValueError(f"start_ratio: must be in [0, 1], got {self.start_ratio!r}")
        if not (isinstance(self.min_start, (int, float)) and 0.0 <= self.min_start < 1.0):
            raise ValueError(f"min_start: must be in [0, 1), got {self.min_start!r}")
        if not isinstance(self.min_points, int) or isinstance(self.min_points, bool) or self.min_points < 1:
            raise ValueError(f"min_points: must be an integer ≥ 1, got {self.min_points!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def align_divisor(loss: np.ndarray, ell_hat: np.ndarray, objective: str = "log") -> float:
    """The divisor c such that loss/c best matches ``ell_hat`` under ``objective``."""
    if objective == "log":
        return float(np.exp(np.mean(np.log(loss) - np.log(ell_hat))))
    if objective == "l2":
        return float(np.dot(loss, loss) / np.dot(loss, ell_hat))
    if objective == "l1":
        # Σ|L_i/c − ℓ̂_i| = Σ L_i·|u − ℓ̂_i/L_i| with u = 1/c: a weighted median of ℓ̂_i/L_i.
        ratio = ell_hat / loss
        order = np.argsort(ratio)
        cum = np.cumsum(loss[order])
        k = int(np.searchsorted(cum, 0.5 * cum[-1]))
        return float(1.0 / ratio[order[min(k, len(order) - 1)]])
    raise ValueError(f"objective: {objective!r} is not one of {OBJECTIVES}")


def segment_indices(
    t_hat: np.ndarray, end: float, start: float, min_points: int
) -> tuple[int, int]:
    """Index range [i0, i1) of the points with start ≤ t̂ ≤ end, holding ≥ ``min_points``."""
    i1 = int(np.searchsorted(t_hat, end, side="right"))
    if i1 < min_points:
        raise ValueError(
            f"alignment: needs at least {min_points} points up to t̂ = {end:.4g}, got {i1}"
        )
    i0 = min(int(np.searchsorted(t_hat, start, side="left")), i1 - min_points)
    return i0, i1


def rms_relative_residual(loss: np.ndarray, ell_hat: np.ndarray, divisor: float) -> float:
    """RMS of L_i/c − ℓ̂_i over the segment (normalised-loss units ≈ relative)."""
    r = loss / divisor - ell_hat
    return float(np.sqrt(np.mean(r * r)))


@dataclass(frozen=True)
class CollapseResiduals:
    """ℓ_run(t̂) − ℓ_ref(t̂) for one run, with the early-align divisor used to normalise it.

    Attributes:
        t_hat: the run's points that the reference covers.
        residual: ℓ_run − ℓ_ref at those points (normalised-loss units).
        final_loss: the early-align divisor L(T) of the run.
        window: the (start, end) t̂ window the divisor was aligned over.
        reference: ℓ_ref at ``t_hat`` (so the relative residual ℓ_run/ℓ_ref − 1 is
            ``residual / reference``, what ``predictors.monitor`` watches).
    """

    t_hat: np.ndarray
    residual: np.ndarray
    final_loss: float
    window: tuple[float, float]
    reference: np.ndarray = field(default_factory=lambda: np.empty(0))


def reference_at(
    t: np.ndarray, reference: Any, controls: Controls | None = None, *, name: str = "reference"
) -> tuple[np.ndarray, np.ndarray]:
    """ℓ_ref at the validated, increasing points ``t``: (mask of the points it covers, ℓ_ref there).

    ``reference`` is a Predictor (needs ``controls``; ℓ_ref = ℓ̂, every point covered) or a
    reference normalised curve: a ``Curve`` (its normalised loss) or a ``(t̂, ℓ)`` pair,
    interpolated linearly; points outside its t̂ range are not covered. Raises ``ValueError``.
    """
    if hasattr(reference, "normalized_curve"):
        if controls is None:
            raise ValueError(f"{name}: a Predictor reference needs the run's controls")
        return np.ones(t.size, dtype=bool), reference.normalized_curve(t, controls)
    if hasattr(reference, "t_hat") and hasattr(reference, "normalized"):
        t_ref, l_ref = reference.t_hat, reference.normalized
    else:
        try:
            t_ref, l_ref = reference
        except (TypeError, ValueError):
            raise ValueError(f"{name}: reference must be a Predictor, a Curve or a (t_hat, ell) pair") from None
    t_ref, l_ref = check_curve(t_ref, l_ref, min_points=2, name=f"{name}: reference")
    inside = (t >= t_ref[0]) & (t <= t_ref[-1])
    return inside, np.interp(t[inside], t_ref, l_ref)


def window_divisor(loss: np.ndarray, ell: np.ndarray, in_window: np.ndarray, window: tuple[float, float],
                   objective: str, name: str, covered: str = "covered by the reference") -> float:
    """The alignment divisor over the points in ``in_window`` (:func:`align_divisor`), for the
    residuals of a run against a reference (``collapse_residuals``, the monitor): at least 2
    points, a finite positive divisor, else ``ValueError`` naming ``name`` and the window."""
    n = int(in_window.sum())
    if n < 2:
        raise ValueError(f"{name}: the run needs at least 2 points in the alignment window "
                         f"[{window[0]:.3g}, {window[1]:.3g}] ({covered}), got {n}")
    divisor = align_divisor(loss[in_window], ell[in_window], objective)
    if not math.isfinite(divisor) or divisor <= 0:
        raise ValueError(f"{name}: alignment gave a non-finite divisor")
    return divisor


def collapse_residuals(
    t_hat: Any,
    loss: Any,
    reference: Any,
    controls: Controls | None = None,
    *,
    window: Sequence[float] = EARLY_ALIGN_WINDOW,
    objective: str = "log",
) -> CollapseResiduals:
    """Residuals of a run's normalised curve against a reference (paper §4 "early-align").

    The run is normalised by the divisor L(T) that best aligns it with the reference over
    ``window`` (default 25–50% of training, as in the paper; the part of it the run has reached
    is used, at least 2 points). ``reference`` is either a Predictor (then ``controls`` gives the
    run's τ, TPP and schedule, and ℓ_ref = ℓ̂) or a reference normalised curve ``(t̂, ℓ)``
    (a pair of arrays, or a ``Curve``, whose normalised loss is used); the reference is linearly
    interpolated, and run points outside its t̂ range are left out.

    Raises ``ValueError`` on bad input (non-finite losses included), a run that has not reached
    the window, or a Predictor reference without ``controls``.
    """
    t, y = check_curve(t_hat, loss, min_points=2, name="collapse_residuals: run")
    lo, hi = (float(window[0]), float(window[1]))
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"collapse_residuals: window must satisfy 0 ≤ start < end ≤ 1, got {window}")
    inside, ref = reference_at(t, reference, controls, name="collapse_residuals")
    t_keep, y_keep = t[inside], y[inside]
    in_window = (t_keep >= lo) & (t_keep <= hi)
    divisor = window_divisor(y_keep, ref, in_window, (lo, hi), objective, "collapse_residuals")
    return CollapseResiduals(t_keep, equations.normalized_loss(y_keep, divisor) - ref, divisor, (lo, hi), ref)


def check_segment(segment: Any) -> tuple[float, float]:
    """Validate an explicit (start, end) alignment segment in t̂."""
    try:
        lo, hi = (float(segment[0]), float(segment[1]))
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"segment: must be a (start, end) pair of training fractions, got {segment!r}") from None
    check_t_hat(np.array([lo, hi]), name="segment", increasing=False)
    if lo > hi:
        raise ValueError(f"segment: start {lo} is after end {hi}")
    return lo, hi
