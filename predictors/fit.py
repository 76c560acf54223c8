"""Fitting the surrogate to reference curves (paper §5, App. D.1).

Objective: the macro-averaged (unweighted mean over curves) MAE between ℓ̂ and the observed
ℓ = L/L(1) over t̂ ∈ [t_min, t_max] (default [0.2, 1], as the paper).

Procedure (paper App. D.1, with the unstated details ours, see docs/predictor.md):

1. Every curve is resampled (linear interpolation) onto one uniform grid of ``grid_points``
   points in [t_min, t_max], so all curves stack into a (curves × grid) array and every
   evaluation is one numpy expression. The MAE is therefore the MAE on that grid (equal to the
   per-point MAE for curves logged at uniform t̂ spacing, up to interpolation).
2. Alternating grid search, as the paper: (b_const, b_exp) with q fixed, then
   (q_const, q_exp) with b fixed (then m with b, q fixed in five-parameter mode), repeated until
   the objective stops improving. Each 2-D grid search is made cheap by a per-curve table: for
   fixed q a curve's MAE is a function of its scalar b only, so we tabulate MAE_i(b) on a log
   grid of b once and look up b_i = b_const·τ_i^b_exp by interpolation for every grid point;
   likewise for q. A coarse grid is followed by two zoomed grids around the best point.
3. Continuous refinement: Nelder–Mead on (log b_const, b_exp, log q_const, q_exp[, log m]) with
   the exact objective, restarted once from its own optimum.
4. The oracle (paper: b, q free per curve, same m) is a per-curve coordinate search on the
   same kind of tables followed by a per-curve compass search, *started at the global fit's
   b_i, q_i and accepting only improvements*, so every curve's oracle MAE is ≤ its fit MAE.
5. ``decision_error``: each fit curve's final loss is predicted from its first s of training
   (s in ``decision_fractions``) with the predictor's alignment; the RMS relative error per s is
   stored in the predictor (in-sample, so optimistic; documented).

If all curves share one τ (one TPP), b_exp (q_exp) is not identifiable and is fixed to 0.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from predictors import equations
from predictors.align import AlignSettings
from predictors.curves import Curve
from predictors.predictor import DECISION_FRACTIONS, DecisionError, Predictor, package_version
from predictors.surrogate import SurrogateParams

# A curve must reach within this of t_min/t_max, and end within FINAL_TOL of t̂ = 1.
COVER_TOL = 0.01
FINAL_TOL = 0.01


@dataclass(frozen=True)
class FitBounds:
    """Search ranges (log-spaced for the positive constants) of the grid searches."""

    b_const: tuple[float, float] = (1e-3, 1e2)
    b_exp: tuple[float, float] = (-2.0, 2.0)
    q_const: tuple[float, float] = (1e-2, 1e1)
    q_exp: tuple[float, float] = (-1.5, 1.5)
    m: tuple[float, float] = (0.005, 0.6)
    # Ranges of the per-curve MAE tables in b and q.
    b_table: tuple[float, float] = (1e-5, 1e3)
    q_table: tuple[float, float] = (1e-3, 30.0)


@dataclass(frozen=True, eq=False)
class FitResult:
    """The fitted predictor and how well it fits.

    Attributes:
        predictor: the fitted :class:`Predictor` (with ``decision_error`` filled).
        fit_mae: macro-averaged MAE of ℓ̂ over [t_min, t_max].
        oracle_mae: the same with b, q free per curve (the error floor; ≤ fit_mae).
        curve_mae, oracle_curve_mae: per-curve MAEs (fit and oracle).
        oracle_b, oracle_q: per-curve oracle parameters.
        decision_rel_errors: stop fraction → per-curve relative error of the predicted final
            loss (NaN where a curve had too few points before s).
        iterations: alternating-search iterations run.
        elapsed_s: wall time of the fit.
    """

    predictor: Predictor
    fit_mae: float
    oracle_mae: float
    curve_mae: np.ndarray
    oracle_curve_mae: np.ndarray
    oracle_b: np.ndarray
    oracle_q: np.ndarray
    decision_rel_errors: dict[float, np.ndarray] = field(default_factory=dict)
    iterations: int = 0
    elapsed_s: float = 0.0


@dataclass
class _Data:
    grid: np.ndarray  # (G,)
    ell: np.ndarray  # (C, G) observed normalised loss on the grid
    eta: np.ndarray  # (C, G) schedule on the grid
    eta1: np.ndarray  # (C, 1) η(1)
    t_last: np.ndarray  # (C, 1) last observed t̂ (the normaliser's position)
    eta_last: np.ndarray  # (C, 1) η(t_last)
    needs_last: bool  # some curve ends before t̂ = 1
    tau: np.ndarray  # (C,)
    tpp: np.ndarray  # (C,)
    eps1: float
    eps2: float


def _prepare(curves: Sequence[Curve], t_min: float, t_max: float, grid_points: int, eps1: float, eps2: float) -> _Data:
    grid = np.linspace(t_min, t_max, grid_points)
    n = len(curves)
    ell = np.empty((n, grid_points))
    eta = np.empty((n, grid_points))
    eta1 = np.empty((n, 1))
    t_last = np.empty((n, 1))
    eta_last = np.empty((n, 1))
    for i, c in enumerate(curves):
        if not isinstance(c, Curve):
            raise ValueError(f"fit: curves[{i}] is a {type(c).__name__}, expected a Curve")
        t = c.t_hat
        label = f"fit: curves[{i}]" + (f" ({c.meta['name']})" if "name" in c.meta else "")
        if t[0] > t_min + COVER_TOL or t[-1] < t_max - COVER_TOL:
            raise ValueError(
                f"{label} covers t̂ ∈ [{t[0]:.3g}, {t[-1]:.3g}], not the fit window [{t_min:.3g}, {t_max:.3g}]"
            )
        if t[-1] < 1.0 - FINAL_TOL:
            raise ValueError(f"{label} ends at t̂ = {t[-1]:.4g}; a fit curve must reach t̂ ≥ {1 - FINAL_TOL}")
        if int(np.sum((t >= t_min) & (t <= t_max))) < 5:
            raise ValueError(f"{label} has fewer than 5 points inside the fit window")
        ell[i] = np.interp(grid, t, c.normalized)
        sched = c.controls.schedule
        eta[i] = sched(grid)
        eta1[i, 0] = sched(1.0)
        t_last[i, 0] = t[-1]
        eta_last[i, 0] = sched(t[-1])
    tau = np.array([c.controls.tau for c in curves], dtype=np.float64)
    tpp = np.array([c.controls.tokens_per_param for c in curves], dtype=np.float64)
    return _Data(grid, ell, eta, eta1, t_last, eta_last, bool(np.any(t_last < 1.0)), tau, tpp, eps1, eps2)


def _model(d: _Data, b: np.ndarray, q: np.ndarray, m: Any, rows: Any = slice(None)) -> np.ndarray:
    """ℓ̂_i on the grid, normalised at each curve's last point; b, q of shape (..., C)."""
    bb = np.asarray(b)[..., None]
    qq = np.asarray(q)[..., None]
    out = equations.surrogate(d.grid, d.eta[rows], d.eta1[rows], bb, qq, m, d.eps1, d.eps2)
    if d.needs_last:
        out = out / equations.surrogate(
            d.t_last[rows], d.eta_last[rows], d.eta1[rows], bb, qq, m, d.eps1, d.eps2
        )
    return out


def _curve_mae(d: _Data, b: np.ndarray, q: np.ndarray, m: Any, rows: Any = slice(None)) -> np.ndarray:
    """Per-curve MAE; b, q of shape (..., C) → (..., C)."""
    return np.mean(np.abs(_model(d, b, q, m, rows) - d.ell[rows]), axis=-1)


def _chunks(k: int, per: int, budget: int = 2_000_000) -> range:
    return range(0, k, max(1, budget // max(per, 1)))


def _table(d: _Data, log_axis: np.ndarray, fixed: np.ndarray, m: float, vary: str) -> np.ndarray:
    """MAE_i(x) for each x in exp(log_axis), the other parameter fixed per curve → (K, C).

    ``vary`` is ``"b"`` (``fixed`` holds q_i) or ``"q"`` (``fixed`` holds b_i).
    """
    n, g = d.ell.shape
    out = np.empty((log_axis.size, n))
    step = _chunks(log_axis.size, n * g).step
    for k in range(0, log_axis.size, step):
        xk = np.exp(log_axis[k : k + step])[:, None] * np.ones(n)
        other = np.broadcast_to(fixed, xk.shape)
        out[k : k + step] = _curve_mae(d, xk, other, m) if vary == "b" else _curve_mae(d, other, xk, m)
    return out


def _lookup(table: np.ndarray, axis: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Linear interpolation of per-curve tables (K, C) at x (..., C) on a uniform axis (clamped)."""
    k = axis.size
    pos = np.clip((x - axis[0]) / (axis[1] - axis[0]), 0.0, k - 1.0)
    i0 = np.minimum(pos.astype(np.int64), k - 2)
    f = pos - i0
    cols = np.arange(table.shape[1])
    return table[i0, cols] * (1.0 - f) + table[i0 + 1, cols] * f


def _grid_pair(
    table: np.ndarray,
    axis: np.ndarray,
    covariate: np.ndarray,
    const_range: tuple[float, float],
    exp_range: tuple[float, float],
    free_exp: bool,
    size: int,
) -> tuple[float, float]:
    """2-D grid search of (log const, exp) minimising mean_i table_i(log const + exp·log x_i)."""
    log_x = np.log(covariate)
    lc_lo, lc_hi = math.log(const_range[0]), math.log(const_range[1])
    e_lo, e_hi = exp_range if free_exp else (0.0, 0.0)
    best = (0.0, 0.0)
    for zoom in range(3):
        lcs = np.linspace(lc_lo, lc_hi, size)
        es = np.linspace(e_lo, e_hi, size) if free_exp else np.zeros(1)
        x = lcs[:, None, None] + es[None, :, None] * log_x[None, None, :]
        score = _lookup(table, axis, x).mean(axis=-1)
        i, j = np.unravel_index(int(np.argmin(score)), score.shape)
        best = (float(lcs[i]), float(es[j]))
        # Zoom: ±2 grid cells around the best point.
        dlc = 2.0 * (lc_hi - lc_lo) / (size - 1)
        lc_lo, lc_hi = best[0] - dlc, best[0] + dlc
        if free_exp:
            de = 2.0 * (e_hi - e_lo) / (size - 1)
            e_lo, e_hi = best[1] - de, best[1] + de
    return best


def fit(
    curves: Sequence[Curve],
    *,
    t_min: float = 0.2,
    t_max: float = 1.0,
    fit_m: bool = False,
    m: float = equations.PAPER_M,
    eps1: float = equations.PAPER_EPS1,
    eps2: float = equations.PAPER_EPS2,
    grid_points: int = 200,
    grid_size: int = 41,
    table_size: int = 241,
    max_iterations: int = 10,
    refine: bool = True,
    bounds: Optional[FitBounds] = None,
    align: Optional[AlignSettings] = None,
    decision_fractions: Sequence[float] = DECISION_FRACTIONS,
    provenance: Optional[Mapping[str, Any]] = None,
) -> FitResult:
    """Fit (b_const, b_exp, q_const, q_exp) — and m with ``fit_m=True`` — to reference curves.

    Args:
        curves: complete curves (each covering [t_min, t_max] and ending at t̂ ≥ 0.99), smoothed.
        t_min, t_max: the MAE window (paper: [0.2, 1]).
        fit_m: five-parameter mode (m fitted; otherwise fixed at ``m``).
        m, eps1, eps2: the constants of Eq. 4 (``m`` is the start value when ``fit_m``).
        grid_points: size of the common t̂ grid the curves are resampled onto.
        grid_size: points per axis of each alternating 2-D grid search (then two zooms).
        table_size: points of the per-curve MAE tables in log b and log q.
        max_iterations: cap on alternating-search iterations.
        refine: run the Nelder–Mead refinement (off only for tests of the grid search).
        bounds: search ranges (:class:`FitBounds`).
        align: alignment settings stored in the predictor (and used for ``decision_error``).
        decision_fractions: stop fractions at which ``decision_error`` is measured ([] skips it).
        provenance: extra provenance merged into the computed one (computed metrics win).

    Raises ``ValueError`` on an empty list, bad windows, or curves that do not cover the window.
    """
    t0 = time.perf_counter()
    bounds = bounds or FitBounds()
    align = align or AlignSettings()
    curves = list(curves)
    if not curves:
        raise ValueError("fit: no curves")
    if not (0.0 <= t_min < t_max <= 1.0):
        raise ValueError(f"fit: need 0 ≤ t_min < t_max ≤ 1, got t_min={t_min}, t_max={t_max}")
    if grid_points < 10 or grid_size < 5 or table_size < 20:
        raise ValueError("fit: grid_points ≥ 10, grid_size ≥ 5 and table_size ≥ 20 are required")
    for name, v in (("m", m), ("eps1", eps1), ("eps2", eps2)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"fit: {name} must be a finite number > 0, got {v!r}")
    d = _prepare(curves, t_min, t_max, grid_points, eps1, eps2)
    free_b_exp = bool(np.ptp(np.log(d.tau)) > 1e-12)
    free_q_exp = bool(np.ptp(np.log(d.tpp)) > 1e-12)

    log_b_axis, log_q_axis = _table_axes(bounds, table_size)
    log_m_axis = np.linspace(math.log(bounds.m[0]), math.log(bounds.m[1]), 4 * grid_size)

    def per_curve(p: np.ndarray, mm: float) -> np.ndarray:
        b = p[0] * d.tau ** p[1]
        q = p[2] * d.tpp ** p[3]
        return _curve_mae(d, b, q, mm)

    # State: (b_const, b_exp, q_const, q_exp), m. Start from q = 1 for every curve.
    p = np.array([0.1, 0.0, 1.0, 0.0])
    mm = float(m)
    best = float(per_curve(p, mm).mean())
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        before = best
        # (b_const, b_exp) with q fixed.
        q_now = p[2] * d.tpp ** p[3]
        table = _table(d, log_b_axis, q_now, mm, "b")
        lc, e = _grid_pair(table, log_b_axis, d.tau, bounds.b_const, bounds.b_exp, free_b_exp, grid_size)
        cand = np.array([math.exp(lc), e, p[2], p[3]])
        score = float(per_curve(cand, mm).mean())
        if score < best:
            p, best = cand, score
        # (q_const, q_exp) with b fixed.
        b_now = p[0] * d.tau ** p[1]
        table = _table(d, log_q_axis, b_now, mm, "q")
        lc, e = _grid_pair(table, log_q_axis, d.tpp, bounds.q_const, bounds.q_exp, free_q_exp, grid_size)
        cand = np.array([p[0], p[1], math.exp(lc), e])
        score = float(per_curve(cand, mm).mean())
        if score < best:
            p, best = cand, score
        if fit_m:
            b_now = p[0] * d.tau ** p[1]
            q_now = p[2] * d.tpp ** p[3]
            ms = np.exp(log_m_axis)
            scores = _curve_mae(d, b_now, q_now, ms[:, None, None]).mean(axis=-1)
            k = int(np.argmin(scores))
            if float(scores[k]) < best:
                mm, best = float(ms[k]), float(scores[k])
        if before - best <= 1e-7 * max(before, 1e-12):
            break

    if refine:
        from scipy.optimize import minimize  # imported here: the run-time predictor needs no scipy

        free = [True, free_b_exp, True, free_q_exp]

        def pack(pp: np.ndarray, m_: float) -> np.ndarray:
            x = [math.log(pp[0]), pp[1], math.log(pp[2]), pp[3]]
            v = [xi for xi, f in zip(x, free) if f]
            return np.array(v + ([math.log(m_)] if fit_m else []))

        def unpack(x: np.ndarray) -> tuple[np.ndarray, float]:
            it = iter(x)
            full = [next(it) if f else 0.0 for f in free]
            m_ = math.exp(next(it)) if fit_m else mm
            return np.array([math.exp(full[0]), full[1], math.exp(full[2]), full[3]]), m_

        def objective(x: np.ndarray) -> float:
            pp, m_ = unpack(x)
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                v = float(per_curve(pp, m_).mean())
            return v if math.isfinite(v) else 1e9

        x = pack(p, mm)
        for _ in range(2):
            res = minimize(
                objective, x, method="Nelder-Mead",
                options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000, "adaptive": x.size > 3},
            )
            if res.fun < best:
                x, best = res.x, float(res.fun)
        p, mm = unpack(x)

    params = SurrogateParams(float(p[0]), float(p[1]), float(p[2]), float(p[3]), float(mm), eps1, eps2)
    b_fit = p[0] * d.tau ** p[1]
    q_fit = p[2] * d.tpp ** p[3]
    curve_mae = per_curve(p, mm)
    ob, oq, oracle_curve = _oracle(d, b_fit, q_fit, mm, curve_mae, log_b_axis, log_q_axis)
    fit_mae = float(curve_mae.mean())
    oracle_mae = float(oracle_curve.mean())

    predictor = Predictor(params, bool(fit_m), align, None, {})
    rel = _decision_errors(predictor, curves, decision_fractions)
    decision_error = None
    if rel:
        fr = sorted(rel)
        rms = [float(np.sqrt(np.nanmean(rel[s] ** 2))) for s in fr]
        bias = [float(np.nanmean(rel[s])) for s in fr]
        n_used = min(int(np.sum(np.isfinite(rel[s]))) for s in fr)
        decision_error = DecisionError(tuple(fr), tuple(rms), "rms", n_used, "in-sample", tuple(bias))

    prov = _provenance(curves, provenance, fit_mae, oracle_mae, t_min, t_max, grid_points, fit_m,
                       free_b_exp, free_q_exp)
    predictor = Predictor(params, bool(fit_m), align, decision_error, prov)
    return FitResult(
        predictor, fit_mae, oracle_mae, curve_mae, oracle_curve, ob, oq, rel, iterations,
        time.perf_counter() - t0,
    )


def _table_axes(bounds: FitBounds, table_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The log b and log q axes of the per-curve MAE tables (shared by the fit and the oracle)."""
    log_b_axis = np.linspace(math.log(bounds.b_table[0]), math.log(bounds.b_table[1]), table_size)
    log_q_axis = np.linspace(math.log(bounds.q_table[0]), math.log(bounds.q_table[1]), table_size)
    return log_b_axis, log_q_axis


@dataclass(frozen=True, eq=False)
class CurveScores:
    """How well an already-fitted predictor describes some curves (see :func:`score_curves`).

    Attributes:
        curve_mae: per-curve MAE of ℓ̂ against ℓ = L/L(last point) over [t_min, t_max].
        oracle_curve_mae: the same with b, q free per curve (same m, ε1, ε2); ≤ curve_mae.
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

    The same resampling, normalisation, window and oracle search as :func:`fit` (so with the
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
    d = _prepare(curves, t_min, t_max, grid_points, p.eps1, p.eps2)
    b = np.asarray(p.b(d.tau), dtype=np.float64)
    q = np.asarray(p.q(d.tpp), dtype=np.float64)
    mae = _curve_mae(d, b, q, p.m)
    log_b_axis, log_q_axis = _table_axes(bounds, table_size)
    ob, oq, oracle = _oracle(d, b, q, p.m, mae, log_b_axis, log_q_axis)
    return CurveScores(mae, oracle, ob, oq)


def _oracle(
    d: _Data,
    b0: np.ndarray,
    q0: np.ndarray,
    m: float,
    mae0: np.ndarray,
    log_b_axis: np.ndarray,
    log_q_axis: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-curve b, q (same m), started at the global fit and accepting only improvements."""
    lb, lq, best = np.log(b0), np.log(q0), mae0.copy()
    # Coordinate search on the tables (exact values at table points).
    for _ in range(4):
        table = _table(d, log_b_axis, np.exp(lq), m, "b")
        k = np.argmin(table, axis=0)
        cand = table[k, np.arange(table.shape[1])]
        better = cand < best
        lb = np.where(better, log_b_axis[k], lb)
        best = np.where(better, cand, best)
        table = _table(d, log_q_axis, np.exp(lb), m, "q")
        k = np.argmin(table, axis=0)
        cand = table[k, np.arange(table.shape[1])]
        better = cand < best
        lq = np.where(better, log_q_axis[k], lq)
        best = np.where(better, cand, best)
    # Compass search in (log b, log q), all curves at once.
    step = np.full(lb.shape, 0.5 * (log_b_axis[1] - log_b_axis[0]) * 4)
    moves = np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [1, 1], [-1, -1], [1, -1], [-1, 1]], dtype=np.float64)
    for _ in range(200):
        cb = lb[None, :] + moves[:, :1] * step[None, :]
        cq = lq[None, :] + moves[:, 1:] * step[None, :]
        with np.errstate(over="ignore", invalid="ignore"):
            scores = _curve_mae(d, np.exp(cb), np.exp(cq), m)
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


def _decision_errors(
    predictor: Predictor, curves: Sequence[Curve], fractions: Sequence[float]
) -> dict[float, np.ndarray]:
    """Relative error of the predicted final loss from the first s of each curve."""
    out: dict[float, np.ndarray] = {}
    for s in fractions:
        s = float(s)
        if not (0.0 < s <= 1.0):
            raise ValueError(f"fit: decision fraction {s} is outside (0, 1]")
        errs = np.full(len(curves), np.nan)
        for i, c in enumerate(curves):
            t, y = c.head(s + 1e-12)
            if t.size < predictor.align.min_points:
                continue
            pred = predictor.predict_final(t, y, c.controls).final_loss
            # Compare at the curve's last point (t̂ = 1 for complete logs).
            t_last = float(c.t_hat[-1])
            at_last = pred * float(predictor.normalized_curve([t_last], c.controls)[0])
            errs[i] = at_last / c.final_loss - 1.0
        if np.any(np.isfinite(errs)):
            out[s] = errs
    return out


def _provenance(
    curves: Sequence[Curve],
    user: Optional[Mapping[str, Any]],
    fit_mae: float,
    oracle_mae: float,
    t_min: float,
    t_max: float,
    grid_points: int,
    fit_m: bool,
    free_b_exp: bool,
    free_q_exp: bool,
) -> dict[str, Any]:
    def uniq(key: str) -> list[Any]:
        vals = {c.meta[key] for c in curves if key in c.meta and c.meta[key] is not None}
        try:
            return sorted(vals)
        except TypeError:
            return sorted(vals, key=str)

    taus = [c.controls.tau for c in curves]
    descriptive: dict[str, Any] = {
        "n_curves": len(curves),
        "model_sizes": uniq("n_params"),
        "tokens_per_param": sorted({float(c.controls.tokens_per_param) for c in curves}),
        "tau_range": [float(min(taus)), float(max(taus))],
        "schedules": sorted({c.controls.schedule.name for c in curves}),
        "warmup_fractions": sorted({float(c.controls.schedule.warmup_fraction) for c in curves}),
        "corpus_hash": (lambda h: h[0] if len(h) == 1 else (h or None))(uniq("corpus_hash")),
    }
    computed = {
        "n_curves": len(curves),
        "fit_mae": fit_mae,
        "oracle_mae": oracle_mae,
        "fit_window": [t_min, t_max],
        "grid_points": grid_points,
        "fit_m": bool(fit_m),
        "b_exp_fixed": not free_b_exp,
        "q_exp_fixed": not free_q_exp,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "package_version": package_version(),
    }
    return {**descriptive, **dict(user or {}), **computed}
