"""How well a surrogate describes curves: the oracle (b, q free per curve) and the scores of a
fitted predictor on (possibly new) curves.

The oracle is the error floor of the surrogate's shape: b and q free per curve (same m and L̂),
a per-curve coordinate search on the MAE tables followed by a per-curve compass search,
started at the global fit and accepting only improvements, so every curve's oracle MAE is ≤
its fit MAE (paper App. D.1; ``predictors.fit`` step 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from predictors.curves import Curve, controls_with_size, curve_size
from predictors.fit_objective import FitBounds, FitData, curve_mae, model_mae, prepare, table, table_axes
from predictors.predictor import Predictor


@dataclass(frozen=True, eq=False)
class CurveScores:
    """How well an already-fitted predictor describes some curves (see :func:`score_curves`).

    Attributes:
        curve_mae: per-curve MAE of ℓ̂ against ℓ = L/L(last point) over [t_min, t_max].
        oracle_curve_mae: the surrogate with b, q free per curve (same m, ε1, ε2); ≤ curve_mae
            for a surrogate predictor (reference curves can beat it).
        oracle_b, oracle_q: per-curve oracle parameters.
    """

    curve_mae: np.ndarray
    oracle_curve_mae: np.ndarray
    oracle_b: np.ndarray
    oracle_q: np.ndarray


def score_curves(
    predictor: Predictor,
    curves: Sequence[Curve],
    *,
    t_min: float = 0.2,
    t_max: float = 1.0,
    grid_points: int = 200,
    table_size: int = 241,
    bounds: Optional[FitBounds] = None,
) -> CurveScores:
    """Per-curve MAE and oracle MAE of a fitted ``predictor`` on (possibly new) ``curves``.

    The MAE is of the curve the predictor draws for each run: the surrogate, or in
    reference-curve mode the calibrated reference curves where they match (``predictors.references``).

    The same resampling, normalisation, window and oracle search as ``predictors.fit.fit`` (so with the
    fit's curves, window and ``grid_points`` it reproduces ``FitResult.curve_mae`` and
    ``oracle_curve_mae``): the held-out counterpart of the fit's MAE, for transfer studies.

    Raises ``ValueError`` on an empty list, a bad window, or curves that do not cover it.
    """
    bounds = bounds or FitBounds()
    curves = list(curves)
    if not curves:
        raise ValueError("score_curves: no curves")
    if not (0.0 <= t_min < t_max <= 1.0):
        raise ValueError(f"score_curves: need 0 ≤ t_min < t_max ≤ 1, got t_min={t_min}, t_max={t_max}")
    p = predictor.params
    d = prepare(curves, t_min, t_max, grid_points, p.eps1, p.eps2)
    if p.irreducible_loss and d.min_loss <= p.irreducible_loss:
        raise ValueError(
            f"score_curves: a curve reaches loss {d.min_loss:.4g}, at or below the predictor's "
            f"irreducible loss L̂ = {p.irreducible_loss:.4g}; this predictor cannot describe it"
        )
    b = np.asarray(p.b(d.tau), dtype=np.float64)
    q = np.asarray(p.q(d.tpp), dtype=np.float64)
    # m per curve: m(N) of the predictor's size term (m itself without one).
    m = (np.array([[p.m_at(curve_size(c))] for c in curves]) if p.has_size_term else p.m)
    surrogate_mae = curve_mae(d, b, q, m, l0=p.irreducible_loss)
    # Reference-curve mode: ℓ is the calibrated runs' normalised curve (the surrogate only where
    # no reference matches), so score what the predictor itself draws. The oracle stays the
    # surrogate shape with b, q free per curve, started from the surrogate's fit in both modes:
    # the common yardstick.
    mae = surrogate_mae if predictor.references is None else _drawn_curve_mae(predictor, curves, d)
    log_b_axis, log_q_axis = table_axes(bounds, table_size)
    ob, oq, oracle_mae = oracle(d, b, q, m, surrogate_mae, log_b_axis, log_q_axis, p.irreducible_loss)
    return CurveScores(mae, oracle_mae, ob, oq)


def _drawn_curve_mae(predictor: Predictor, curves: Sequence[Curve], d: FitData) -> np.ndarray:
    """Per-curve MAE of what ``predictor.normalized_curve`` draws for each curve, normalised at
    its last point like ``predictors.fit_objective.model``."""
    model = np.empty_like(d.ell)
    for i, c in enumerate(curves):
        controls = controls_with_size(c)
        model[i] = predictor.normalized_curve(d.grid, controls)
        if d.needs_last:
            model[i] /= predictor.normalized_curve(d.t_last[i], controls)
    return model_mae(d, model, l0=predictor.params.irreducible_loss)


def oracle(
    d: FitData,
    b0: np.ndarray,
    q0: np.ndarray,
    m: float,
    mae0: np.ndarray,
    log_b_axis: np.ndarray,
    log_q_axis: np.ndarray,
    l0: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-curve b, q (same m and L̂), started at the global fit and accepting only improvements.

    Stays inside the tables' box (the surrogate's physical box)."""
    lb, lq, best = np.log(b0), np.log(q0), mae0.copy()
    # Coordinate search on the tables (exact values at table points).
    for _ in range(4):
        tab = table(d, log_b_axis, np.exp(lq), m, "b", l0)
        k = np.argmin(tab, axis=0)
        cand = tab[k, np.arange(tab.shape[1])]
        better = cand < best
        lb = np.where(better, log_b_axis[k], lb)
        best = np.where(better, cand, best)
        tab = table(d, log_q_axis, np.exp(lb), m, "q", l0)
        k = np.argmin(tab, axis=0)
        cand = tab[k, np.arange(tab.shape[1])]
        better = cand < best
        lq = np.where(better, log_q_axis[k], lq)
        best = np.where(better, cand, best)
    # Compass search in (log b, log q), all curves at once.
    step = np.full(lb.shape, 0.5 * (log_b_axis[1] - log_b_axis[0]) * 4)
    moves = np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [1, 1], [-1, -1], [1, -1], [-1, 1]], dtype=np.float64)
    for _ in range(200):
        cb = np.clip(lb[None, :] + moves[:, :1] * step[None, :], log_b_axis[0], log_b_axis[-1])
        cq = np.clip(lq[None, :] + moves[:, 1:] * step[None, :], log_q_axis[0], log_q_axis[-1])
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            scores = curve_mae(d, np.exp(cb), np.exp(cq), m, l0=l0)
        scores = np.where(np.isfinite(scores), scores, np.inf)
        j = np.argmin(scores, axis=0)
        cols = np.arange(lb.size)
        cand = scores[j, cols]
        better = cand < best
        lb = np.where(better, cb[j, cols], lb)
        lq = np.where(better, cq[j, cols], lq)
        best = np.where(better, cand, best)
        step = np.where(better, step, step * 0.5)
        if np.all(step < 1e-6):
            break
    return np.exp(lb), np.exp(lq), best
