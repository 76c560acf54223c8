"""The lowest layer: the paper's equations and LR schedules, normalisation, the collapse surrogate,
its fit, alignment and persistence, and the atomic-write/strict-JSON helpers (``predictors.io``).

Imports numpy, scipy (fit only) and pydantic; never torch, Ray, ``trainers`` or ``hpo``.
"""

from predictors.align import AlignSettings, CollapseResiduals, align_divisor, collapse_residuals
from predictors.controls import Controls
from predictors.curves import Curve
from predictors.fit import CurveScores, FitBounds, FitResult, fit, score_curves
from predictors.normalize import (
    check_curve,
    drop_nonfinite,
    normalize_loss,
    smooth_loss,
    training_fraction_of,
    window_tokens_of,
)
from predictors.prediction import Prediction
from predictors.predictor import DecisionError, NParamsMissingWarning, Predictor
from predictors.schedules import Schedule
from predictors.surrogate import SurrogateParams, normalized_surrogate

__all__ = [
    "AlignSettings",
    "CollapseResiduals",
    "Controls",
    "Curve",
    "CurveScores",
    "DecisionError",
    "FitBounds",
    "FitResult",
    "NParamsMissingWarning",
    "Prediction",
    "Predictor",
    "Schedule",
    "SurrogateParams",
    "align_divisor",
    "check_curve",
    "collapse_residuals",
    "drop_nonfinite",
    "fit",
    "normalize_loss",
    "normalized_surrogate",
    "score_curves",
    "smooth_loss",
    "training_fraction_of",
    "window_tokens_of",
]
