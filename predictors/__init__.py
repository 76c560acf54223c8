"""Normalisation, the paper's collapse surrogate, its fit, alignment and persistence."""

from predictors.controls import Controls
from predictors.prediction import Prediction

__all__ = ["Controls", "Prediction"]
