"""The result of aligning a partial loss curve to the surrogate (paper §5, step 5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """A predicted final loss with its uncertainty.

    Attributes:
        final_loss: the divisor L(T) that best aligns the observed segment with ℓ̂
            (the predicted final loss, in loss units).
        uncertainty: one standard deviation of ``final_loss``, in loss units. Combines the
            residual scale of the alignment with the predictor's calibrated error at this
            stop fraction.
        stop_fraction: the last training fraction s used.
        segment_start: the first training fraction used in the alignment.
        n_points: number of curve points in the aligned segment.
        residual: RMS relative residual of the aligned segment (L/L(T) − ℓ̂).
        error_source: which calibrated error e(s) went into ``uncertainty`` (in-scale,
            cross-scale, or uncalibrated) and why.
        curve_source: which normalised curve the run was aligned to: the surrogate, the
            surrogate's size term at the run's N, or calibrated reference curves.
    """

    final_loss: float
    uncertainty: float
    stop_fraction: float
    segment_start: float
    n_points: int
    residual: float
    error_source: str = "uncalibrated"
    curve_source: str = "surrogate"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
