"""The result of aligning a partial loss curve to the surrogate (paper §5, step 5), and the
prediction a trial gets at a rung (:func:`predict_at_rungs`: the points of ``rung_cut`` handed to
the predictor, in one batch; never raises)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from predictors.controls import Controls
from predictors.curves import rung_cut
from predictors.io import finite_or_none

#: Fewest history points (up to and including the rung point) a prediction at a rung needs by default.
DEFAULT_MIN_POINTS = 3
logger = logging.getLogger("predictors.prediction")


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


@dataclass(frozen=True)
class RungPrediction:
    """What a trial gets at a rung: the prediction and the point it was made from.

    ``final_loss``/``uncertainty`` are None (and ``why`` says why) when there is no
    prediction; ``train_fraction``/``loss`` are the t̂ and smoothed loss of the rung point
    (None when the history never reaches the rung).
    """

    final_loss: Optional[float]
    uncertainty: Optional[float]
    n_points: int
    train_fraction: Optional[float]
    loss: Optional[float]
    why: str = ""
    residual: Optional[float] = None  # RMS relative residual of the alignment (the fit to the shape)


def predict_at_rung(
    predictor: Any,
    t_hat: Sequence[float],
    loss: Sequence[float],
    controls: Optional[Controls | Mapping[str, Any]],
    stop_fraction: float,
    min_points: int = DEFAULT_MIN_POINTS,
) -> RungPrediction:
    """The prediction a trial gets at rung ``stop_fraction`` from its (t̂, smoothed loss)
    history: the points of ``rung_cut`` handed to ``predictor.predict_final`` with the
    trial's controls. Never raises: no controls, too few points, a failing predictor or a
    non-finite result give a :class:`RungPrediction` without a prediction."""
    return predict_at_rungs(predictor, [(t_hat, loss)], [controls], stop_fraction, min_points)[0]


def predict_at_rungs(
    predictor: Any,
    histories: Sequence[tuple[Sequence[float], Sequence[float]]],
    controls: Sequence[Optional[Controls | Mapping[str, Any]]],
    stop_fraction: float,
    min_points: int = DEFAULT_MIN_POINTS,
    calibrated_error: bool = True,
) -> list[RungPrediction]:
    """:func:`predict_at_rung` for many trials at one rung, in one call of the predictor's
    batched ``predict_finals`` (a rung of 10,000 trials is one vectorised pass; a predictor
    without it is asked run by run). ``calibrated_error=False``: the caller reads only the
    predicted finals (``Predictor.predict_finals``)."""
    out: list[Optional[RungPrediction]] = [None] * len(histories)
    asked: list[tuple[int, np.ndarray, np.ndarray, Controls, float, float, int]] = []
    for i, ((t_hat, loss), ctrl) in enumerate(zip(histories, controls)):
        t = np.asarray(t_hat, dtype=np.float64)
        y = np.asarray(loss, dtype=np.float64)
        n = rung_cut(t, stop_fraction)
        if n is None:
            out[i] = RungPrediction(None, None, int(t.size), None, None,
                                    f"the history never reaches t̂ = {stop_fraction:g}")
            continue
        t_used, loss_used = float(t[n - 1]), float(y[n - 1])
        if ctrl is None:
            out[i] = RungPrediction(None, None, n, t_used, loss_used,
                                    "no controls (tau, tokens_per_param, schedule) in the results or config")
        elif n < min_points:
            out[i] = RungPrediction(None, None, n, t_used, loss_used, f"only {n} point(s) up to the rung, min_points={min_points}")
        else:
            try:
                asked.append((i, t[:n], y[:n], ctrl if isinstance(ctrl, Controls) else Controls.from_mapping(ctrl),
                              t_used, loss_used, n))
            except Exception as exc:  # noqa: BLE001 - bad controls keep the trial
                out[i] = RungPrediction(None, None, n, t_used, loss_used, f"predictor failed: {type(exc).__name__}: {exc}")
    for (i, _, _, _, t_used, loss_used, n), pred in zip(asked, _predict_all(predictor, asked, calibrated_error)):
        out[i] = _rung_prediction(pred, n, t_used, loss_used)
    return out  # type: ignore[return-value]


def _predict_all(predictor: Any, asked: Sequence[tuple], calibrated_error: bool) -> list[Any]:
    """The predictor's answer per asked run: a prediction or the exception it raised."""
    if not asked:
        return []
    batched = getattr(predictor, "predict_finals", None)
    if batched is not None:
        try:
            return list(batched([a[1] for a in asked], [a[2] for a in asked], [a[3] for a in asked],
                                calibrated_error=calibrated_error))
        except Exception as exc:  # noqa: BLE001 - a failing batch: each run asked alone below
            logger.warning("predict_finals failed (%s); predicting run by run", exc)
    answers: list[Any] = []
    for _, t, y, ctrl, *_ in asked:
        try:
            answers.append(predictor.predict_final(t, y, ctrl))
        except Exception as exc:  # noqa: BLE001 - a failed prediction keeps the trial
            answers.append(exc)
    return answers


def _rung_prediction(pred: Any, n: int, t_used: float, loss_used: float) -> RungPrediction:
    if isinstance(pred, Exception):
        return RungPrediction(None, None, n, t_used, loss_used, f"predictor failed: {type(pred).__name__}: {pred}")
    final = finite_or_none(getattr(pred, "final_loss", None))
    sigma = finite_or_none(getattr(pred, "uncertainty", None))
    residual = finite_or_none(getattr(pred, "residual", None))
    if final is None or final <= 0:
        return RungPrediction(None, None, n, t_used, loss_used, "predictor returned a non-finite final loss")
    return RungPrediction(final, None if sigma is None else abs(sigma), n, t_used, loss_used, residual=residual)
