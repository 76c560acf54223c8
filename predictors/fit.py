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

Robustness (issue 10): every parameter stays in a physical box (``FitBounds``; Nelder–Mead
runs with those bounds, and a point where some reference curve's b or q leaves
``surrogate.B_BOX``/``Q_BOX`` is rejected), so a fit is always finite. A parameter the bank
cannot identify is fixed and said so (``FitResult.notes``, provenance ``fixed_parameters``):
b_exp (q_exp) when τ (TPP) spans less than ``MIN_SPAN``× (one value, or two nearly equal
ones), and q (q_const = 1, q_exp = 0) when no curve's schedule varies over the fit window
(a constant LR: only b·(1+ε2)^q would be seen).

Irreducible loss (``fit_irreducible=True``): one offset L̂ in loss units shared by every curve
(Eq. 1 with L̂, ``equations.reducible_normalized_loss``), fitted in [0, 0.9·lowest reference
loss]. The objective stays the MAE in ℓ = L/L(1) units, with the model
L̂/L(1) + (1 − L̂/L(1))·ℓ̂ (so a larger L̂ cannot shrink the error by rescaling it).
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from predictors import equations
from predictors.align import AlignSettings
from predictors.curves import Curve, controls_with_size, curve_size
from predictors.predictor import DECISION_FRACTIONS, DecisionError, Predictor, package_version
from predictors.surrogate import B_BOX, M_BOX, Q_BOX, SurrogateParams

# A curve must reach within this of t_min/t_max, and end within FINAL_TOL of t̂ = 1.
COVER_TOL = 0.01
FINAL_TOL = 0.01
logger = logging.getLogger(__name__)
# An exponent is fitted only when its covariate (τ or TPP) spans at least this factor.
MIN_SPAN = 1.5
# The irreducible loss is searched in [0, L0_MAX_FRACTION · lowest reference loss].
L0_MAX_FRACTION = 0.9
# Objective value of a parameter point outside the box (no finite fit ever scores this).
OUTSIDE_BOX = 1e6


@dataclass(frozen=True)
class FitBounds:
    """Search ranges (log-spaced for the positive constants) of the grid searches."""

    b_const: tuple[float, float] = (1e-3, 1e2)
    b_exp: tuple[float, float] = (-2.0, 2.0)
    q_const: tuple[float, float] = (1e-2, 1e1)
    q_exp: tuple[float, float] = (-1.5, 1.5)
    m: tuple[float, float] = (0.005, 0.6)
    # The size term's exponent, m(N) = m·(N/N_ref)^m_size_exp (predictors.surrogate).
    m_size_exp: tuple[float, float] = (-1.0, 1.0)
    # Ranges of the per-curve MAE tables in b and q (the physical box of the surrogate).
    b_table: tuple[float, float] = B_BOX
    q_table: tuple[float, float] = Q_BOX


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
        notes: the fit log: parameters fixed as unidentifiable, bounds that were hit.
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
    notes: tuple[str, ...] = ()


@dataclass
class _Data:
    grid: np.ndarray  # (G,)
    ell: np.ndarray  # (C, G) observed normalised loss on the grid
    eta: np.ndarray  # (C, G) schedule on the grid
    eta1: np.ndarray  # (C, 1) η(1)
    t_last: np.ndarray  # (C, 1) last observed t̂ (the normaliser's position)
    eta_last: np.ndarray  # (C, 1) η(t_last)
    needs_last: bool  # some curve ends before t̂ = 1
    tau: np.ndarray  # (C,) τ as the covariate of b(τ): a τ = ∞ curve (λ = 0) counts as 1 (b_exp is then fixed at 0)
    tpp: np.ndarray  # (C,)
    log_n: np.ndarray  # (C,) log(N_i/N_ref), 0 where N is unknown
    size_ref: float  # N_ref: geometric centre of the distinct sizes (1.0 when none is known)
    sizes_known: bool  # every curve reports its N
    n_no_decay: int  # curves with τ = ∞
    eps1: float
    eps2: float
    final: np.ndarray  # (C, 1) loss at the last point (the normaliser L(1))
    min_loss: float  # lowest loss of any curve from t_min on (bounds the irreducible loss)


def _prepare(curves: Sequence[Curve], t_min: float, t_max: float, grid_points: int, eps1: float, eps2: float) -> _Data:
    grid = np.linspace(t_min, t_max, grid_points)
    n = len(curves)
    ell = np.empty((n, grid_points))
    eta = np.empty((n, grid_points))
    eta1 = np.empty((n, 1))
    t_last = np.empty((n, 1))
    eta_last = np.empty((n, 1))
    final = np.empty((n, 1))
    min_loss = math.inf
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
        final[i, 0] = c.final_loss
        min_loss = min(min_loss, float(np.min(c.loss[t >= t_min])))
    tau = np.array([c.controls.tau for c in curves], dtype=np.float64)
    no_decay = np.isinf(tau)
    tau = np.where(no_decay, 1.0, tau)
    tpp = np.array([c.controls.tokens_per_param for c in curves], dtype=np.float64)
    sizes = np.array([np.nan if (n := curve_size(c)) is None else n for c in curves], dtype=np.float64)
    known = bool(np.all(np.isfinite(sizes)))
    distinct = _distinct(sizes[np.isfinite(sizes)])
    size_ref = float(np.exp(np.mean(np.log(distinct)))) if distinct else 1.0
    log_n = np.where(np.isfinite(sizes), np.log(np.where(np.isfinite(sizes), sizes, 1.0) / size_ref), 0.0)
    return _Data(grid, ell, eta, eta1, t_last, eta_last, bool(np.any(t_last < 1.0)), tau, tpp, log_n, size_ref,
                 known, int(no_decay.sum()), eps1, eps2, final, min_loss)


def _distinct(values: np.ndarray, tolerance: float = 0.01) -> list[float]:
    """Distinct values (within a relative ``tolerance``), ascending."""
    out: list[float] = []
    for v in sorted(float(x) for x in values):
        if not out or abs(v / out[-1] - 1.0) > tolerance:
            out.append(v)
    return out


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


def _curve_mae(
    d: _Data, b: np.ndarray, q: np.ndarray, m: Any, rows: Any = slice(None), l0: Any = 0.0
) -> np.ndarray:
    """Per-curve MAE in ℓ = L/L(1) units; b, q of shape (..., C) → (..., C).

    With an irreducible loss L̂ = ``l0`` (scalar, or shape (..., 1, 1)) the model of L/L(1) is
    r + (1 − r)·ℓ̂ with r = L̂/L(1) per curve (Eq. 1 with the offset, solved for L).
    """
    return _model_mae(d, _model(d, b, q, m, rows), rows, l0)


def _model_mae(d: _Data, model: np.ndarray, rows: Any = slice(None), l0: Any = 0.0) -> np.ndarray:
    """Per-curve MAE of a modelled ℓ̂ on ``d``'s grid (normalised at each curve's last point)
    against the observed ℓ, with the irreducible loss ``l0`` as in :func:`_curve_mae`."""
    if np.any(np.asarray(l0) != 0.0):
        model = equations.loss_ratio_from_normalized(model, d.final[rows], l0)
    return np.mean(np.abs(model - d.ell[rows]), axis=-1)


def _chunks(k: int, per: int, budget: int = 2_000_000) -> range:
    return range(0, k, max(1, budget // max(per, 1)))


def _table(d: _Data, log_axis: np.ndarray, fixed: np.ndarray, m: float, vary: str, l0: float = 0.0) -> np.ndarray:
    """MAE_i(x) for each x in exp(log_axis), the other parameter fixed per curve → (K, C).

    ``vary`` is ``"b"`` (``fixed`` holds q_i) or ``"q"`` (``fixed`` holds b_i).
    """
    n, g = d.ell.shape
    out = np.empty((log_axis.size, n))
    step = _chunks(log_axis.size, n * g).step
    for k in range(0, log_axis.size, step):
        xk = np.exp(log_axis[k : k + step])[:, None] * np.ones(n)
        other = np.broadcast_to(fixed, xk.shape)
        with np.errstate(over="ignore", under="ignore"):
            out[k : k + step] = (_curve_mae(d, xk, other, m, l0=l0) if vary == "b"
                                 else _curve_mae(d, other, xk, m, l0=l0))
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
    """2-D grid search of (log const, exp) minimising mean_i table_i(log const + exp·log x_i).

    The zoomed grids stay inside ``const_range`` and ``exp_range``: a best point on the edge
    of the box used to zoom past it (a saved q_const of 14.6 with the bound at 10, issue 15)."""
    log_x = np.log(covariate)
    box_lc = (math.log(const_range[0]), math.log(const_range[1]))
    box_e = exp_range if free_exp else (0.0, 0.0)
    lc_lo, lc_hi = box_lc
    e_lo, e_hi = box_e
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
        lc_lo, lc_hi = max(best[0] - dlc, box_lc[0]), min(best[0] + dlc, box_lc[1])
        if free_exp:
            de = 2.0 * (e_hi - e_lo) / (size - 1)
            e_lo, e_hi = max(best[1] - de, box_e[0]), min(best[1] + de, box_e[1])
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
    fit_irreducible: bool = False,
    irreducible_loss: float = 0.0,
    grid_points: int = 200,
    grid_size: int = 41,
    table_size: int = 241,
    max_iterations: int = 10,
    refine: bool = True,
    bounds: Optional[FitBounds] = None,
    align: Optional[AlignSettings] = None,
    decision_fractions: Sequence[float] = DECISION_FRACTIONS,
    provenance: Optional[Mapping[str, Any]] = None,
    size_term: bool = True,
) -> FitResult:
    """Fit (b_const, b_exp, q_const, q_exp) — and m with ``fit_m=True`` — to reference curves.

    Args:
        curves: complete curves (each covering [t_min, t_max] and ending at t̂ ≥ 0.99), smoothed.
        t_min, t_max: the MAE window (paper: [0.2, 1]).
        fit_m: five-parameter mode (m fitted; otherwise fixed at ``m``).
        m, eps1, eps2: the constants of Eq. 4 (``m`` is the start value when ``fit_m``).
        fit_irreducible: also fit the irreducible loss L̂ of Eq. 1 (module docstring); off
            (L̂ = 0, the paper's choice) by default.
        irreducible_loss: L̂ in loss units: the start value when ``fit_irreducible``, else
            held fixed (must be below every reference loss).
        grid_points: size of the common t̂ grid the curves are resampled onto.
        grid_size: points per axis of each alternating 2-D grid search (then two zooms).
        table_size: points of the per-curve MAE tables in log b and log q.
        max_iterations: cap on alternating-search iterations.
        refine: run the Nelder–Mead refinement (off only for tests of the grid search).
        bounds: search ranges (:class:`FitBounds`); every fitted parameter stays inside them.
        align: alignment settings stored in the predictor (and used for ``decision_error``).
        decision_fractions: stop fractions at which ``decision_error`` is measured ([] skips it).
        provenance: extra provenance merged into the computed one (computed metrics win).
        size_term: fit the size term m(N) = m·(N/N_ref)^m_size_exp (``predictors.surrogate``)
            when every curve reports its N and the sizes span at least ``MIN_SPAN``×; with
            one size (or ``False``) m_size_exp stays 0, the paper's surrogate.

    Always returns finite parameters. Raises ``ValueError`` on an empty list, bad windows,
    curves that do not cover the window, or ``m`` outside ``bounds.m``.

    Example:
        Four noiseless curves drawn from a known surrogate (two τ × two TPP) are fitted to
        well under 0.1% MAE, and the oracle (b, q free per curve) is never worse than the fit:

        >>> import numpy as np
        >>> from predictors import Controls, Curve, Predictor, SurrogateParams, fit
        >>> truth = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1))
        >>> t_hat = np.linspace(0.01, 1.0, 100)
        >>> controls = [Controls(tau, tpp) for tau in (0.1, 1.0) for tpp in (20, 80)]
        >>> curves = [Curve(t_hat, 1.7 * truth.normalized_curve(t_hat, c), c) for c in controls]
        >>> result = fit(curves, decision_fractions=())
        >>> bool(result.fit_mae < 1e-3), bool(result.oracle_mae <= result.fit_mae)
        (True, True)
        >>> result.predictor.params.m == 0.05  # the paper's m unless fit_m=True
        True
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
    if not (bounds.m[0] <= m <= bounds.m[1]):
        raise ValueError(f"fit: m = {m!r} is outside the bounds {bounds.m}")
    d = _prepare(curves, t_min, t_max, grid_points, eps1, eps2)
    if not (math.isfinite(irreducible_loss) and 0.0 <= irreducible_loss < d.min_loss):
        raise ValueError(f"fit: irreducible_loss must be in [0, {d.min_loss:.4g}) (the lowest reference loss), "
                         f"got {irreducible_loss!r}")
    fixed, notes = _identifiability(d, size_term)
    free_b_exp = "b_exp" not in fixed
    free_q_exp = "q_exp" not in fixed
    free_q = "q_const" not in fixed
    free_size = size_term and "m_size_exp" not in fixed
    l0_max = max(L0_MAX_FRACTION * d.min_loss, irreducible_loss) if fit_irreducible else 0.0

    log_b_axis, log_q_axis = _table_axes(bounds, table_size)
    log_m_axis = np.linspace(math.log(bounds.m[0]), math.log(bounds.m[1]), 4 * grid_size)
    size_axis = np.linspace(bounds.m_size_exp[0], bounds.m_size_exp[1], 4 * grid_size + 1)

    def b_q(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return p[0] * d.tau ** p[1], p[2] * d.tpp ** p[3]

    def per_curve(p: np.ndarray, mm: float, mn: float, l0: float) -> np.ndarray:
        return _curve_mae(d, *b_q(p), _m_curves(d, mm, mn), l0=l0)

    def score(p: np.ndarray, mm: float, mn: float, l0: float) -> float:
        b, q = b_q(p)
        # Rejected unless every reference curve's b and q lie in the surrogate's physical box.
        if not np.all((b >= B_BOX[0]) & (b <= B_BOX[1]) & (q >= Q_BOX[0]) & (q <= Q_BOX[1])):
            return OUTSIDE_BOX
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            v = float(_curve_mae(d, b, q, _m_curves(d, mm, mn), l0=l0).mean())
        return v if math.isfinite(v) else OUTSIDE_BOX

    # State: (b_const, b_exp, q_const, q_exp), m, the size exponent, L̂. Start from q = 1 for every curve.
    p = np.array([0.1, 0.0, 1.0, 0.0])
    mm, mn, l0 = float(m), 0.0, float(irreducible_loss)
    best = score(p, mm, mn, l0)
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        before = best
        b_pre, q_pre = b_q(p)
        if free_size:
            # The size exponent of m(N) = m·(N/N_ref)^m_size_exp, b and q fixed.
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                scores = _curve_mae(d, b_pre, q_pre, _m_curves(d, mm, size_axis[:, None, None]), l0=l0).mean(axis=-1)
            scores = np.where(np.isfinite(scores), scores, OUTSIDE_BOX)
            k = int(np.argmin(scores))
            if float(scores[k]) < best:
                mn, best = float(size_axis[k]), float(scores[k])
        m_now = _m_curves(d, mm, mn)
        # (b_const, b_exp) with q fixed.
        q_now = p[2] * d.tpp ** p[3]
        table = _table(d, log_b_axis, q_now, m_now, "b", l0)
        lc, e = _grid_pair(table, log_b_axis, d.tau, bounds.b_const, bounds.b_exp, free_b_exp, grid_size)
        cand = np.array([math.exp(lc), e, p[2], p[3]])
        if (s_ := score(cand, mm, mn, l0)) < best:
            p, best = cand, s_
        if free_q:
            # (q_const, q_exp) with b fixed.
            b_now = p[0] * d.tau ** p[1]
            table = _table(d, log_q_axis, b_now, m_now, "q", l0)
            lc, e = _grid_pair(table, log_q_axis, d.tpp, bounds.q_const, bounds.q_exp, free_q_exp, grid_size)
            cand = np.array([p[0], p[1], math.exp(lc), e])
            if (s_ := score(cand, mm, mn, l0)) < best:
                p, best = cand, s_
        b_now = p[0] * d.tau ** p[1]
        q_now = p[2] * d.tpp ** p[3]
        if fit_m:
            ms = np.exp(log_m_axis)
            scores = _curve_mae(d, b_now, q_now, _m_curves(d, ms[:, None, None], mn), l0=l0).mean(axis=-1)
            k = int(np.argmin(scores))
            if float(scores[k]) < best:
                mm, best = float(ms[k]), float(scores[k])
        if fit_irreducible:
            l0s = np.linspace(0.0, l0_max, 4 * grid_size)
            scores = _curve_mae(d, b_now, q_now, _m_curves(d, mm, mn), l0=l0s[:, None, None]).mean(axis=-1)
            k = int(np.argmin(scores))
            if float(scores[k]) < best:
                l0, best = float(l0s[k]), float(scores[k])
        if before - best <= 1e-7 * max(before, 1e-12):
            break

    if refine:
        p, mm, mn, l0, best = _refine(p, mm, mn, l0, best, score, bounds, fit_m, free_size, l0_max,
                                      (True, free_b_exp, free_q, free_q_exp))
    # Every saved parameter lies inside its bound (issue 15: a zoom once left the box).
    p, mm, mn = _clip_to_bounds(p, mm, mn, bounds)

    notes += _bound_notes(p, mm, l0, bounds, fit_m, fit_irreducible, l0_max)
    if free_size and abs(mn - bounds.m_size_exp[0]) < 1e-9 or free_size and abs(mn - bounds.m_size_exp[1]) < 1e-9:
        notes.append(f"m_size_exp = {mn:.4g} is on its bound [{bounds.m_size_exp[0]:g}, {bounds.m_size_exp[1]:g}]")
    for note in notes:
        logger.info("fit: %s", note)
    size_ref = d.size_ref if free_size else 1.0
    params = SurrogateParams(float(p[0]), float(p[1]), float(p[2]), float(p[3]), float(mm), eps1, eps2, float(l0),
                             float(mn) if free_size else 0.0, float(size_ref))
    b_fit = np.asarray(params.b(d.tau))
    q_fit = np.asarray(params.q(d.tpp))
    curve_mae = per_curve(p, mm, mn if free_size else 0.0, l0)
    if not np.all(np.isfinite(curve_mae)):  # the box makes this unreachable; never ship NaN
        raise ValueError("fit: the fitted surrogate is non-finite on the reference curves")
    m_fit = _m_curves(d, mm, mn if free_size else 0.0)
    ob, oq, oracle_curve = _oracle(d, b_fit, q_fit, m_fit, curve_mae, log_b_axis, log_q_axis, l0)
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
    prov.update({"fixed_parameters": fixed, "fit_notes": list(notes),
                 "irreducible_loss_fitted": bool(fit_irreducible), "size_term": bool(free_size)})
    predictor = Predictor(params, bool(fit_m), align, decision_error, prov)
    return FitResult(
        predictor, fit_mae, oracle_mae, curve_mae, oracle_curve, ob, oq, rel, iterations,
        time.perf_counter() - t0, tuple(notes),
    )


def _m_curves(d: _Data, mm: Any, mn: Any) -> Any:
    """m per curve, m·(N_i/N_ref)^mn clipped into ``M_BOX``, shaped to broadcast against the
    (..., curves, grid) model: the scalar ``mm`` itself without a size term. ``mm`` and ``mn``
    may carry leading grid axes (..., 1, 1)."""
    if np.ndim(mn) == 0 and float(mn) == 0.0:
        return mm
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        factor = np.exp(np.asarray(mn) * d.log_n[:, None])
    return np.clip(np.asarray(mm) * factor, *M_BOX)


def _clip_to_bounds(p: np.ndarray, mm: float, mn: float, bounds: FitBounds) -> tuple[np.ndarray, float, float]:
    lo = [bounds.b_const[0], bounds.b_exp[0], bounds.q_const[0], bounds.q_exp[0]]
    hi = [bounds.b_const[1], bounds.b_exp[1], bounds.q_const[1], bounds.q_exp[1]]
    # The exponents fixed at 0 may lie outside a user's bounds that exclude 0: keep them at 0.
    clipped = np.clip(p, lo, hi)
    clipped[1] = p[1] if p[1] == 0.0 else clipped[1]
    clipped[3] = p[3] if p[3] == 0.0 else clipped[3]
    # A fixed m (fit_m=False) was checked against the bounds on entry.
    mm = float(np.clip(mm, *bounds.m))
    mn = float(np.clip(mn, *bounds.m_size_exp)) if mn != 0.0 else 0.0
    return clipped, mm, mn


def _identifiability(d: _Data, size_term: bool = True) -> tuple[dict[str, str], list[str]]:
    """Parameters the bank cannot identify (name → why), and the fit-log lines saying so."""
    fixed: dict[str, str] = {}

    def span(values: np.ndarray) -> float:
        return float(values.max() / values.min())

    n = d.tau.size
    if d.n_no_decay:
        # τ = ∞ has no place on the τ^b_exp power law: the τ term is fixed (issue 15).
        fixed["b_exp"] = (f"{d.n_no_decay} of {n} curves have no weight decay (λ = 0, τ = ∞): the τ term of "
                          "Eq. 5 is fixed, b_exp = 0 (b = b_const for every τ)")
    elif span(d.tau) < MIN_SPAN:
        fixed["b_exp"] = (f"τ spans {d.tau.min():.4g}–{d.tau.max():.4g} (< {MIN_SPAN:g}×): "
                          "b_exp fixed at 0")
    if float(np.max(np.ptp(d.eta, axis=1))) < 1e-9:
        why = ("the LR schedule is constant over the fit window in every curve, so only "
               "b·(η+ε2)^q is seen: q fixed at 1 (q_const = 1, q_exp = 0)")
        fixed["q_const"] = why
        fixed["q_exp"] = why
    elif span(d.tpp) < MIN_SPAN:
        fixed["q_exp"] = (f"TPP spans {d.tpp.min():.4g}–{d.tpp.max():.4g} (< {MIN_SPAN:g}×): "
                          "q_exp fixed at 0")
    notes = [f"{name} not identifiable from the bank: {why}" for name, why in fixed.items()
             if not (name == "q_exp" and "q_const" in fixed)]
    if size_term:
        # Not a failure of the bank: one size is the usual case, so it is recorded, not noted.
        if not d.sizes_known:
            fixed["m_size_exp"] = "not every curve reports its model size N: no size term (m_size_exp = 0)"
        elif float(np.exp(np.ptp(d.log_n))) < MIN_SPAN:
            fixed["m_size_exp"] = (f"the model sizes span {float(np.exp(np.ptp(d.log_n))):.3g}× (< {MIN_SPAN:g}×): "
                                   "no size term (m_size_exp = 0)")
    return fixed, notes


def _refine(
    p: np.ndarray, mm: float, mn: float, l0: float, best: float, score: Any, bounds: FitBounds,
    fit_m: bool, fit_size: bool, l0_max: float, free: tuple[bool, bool, bool, bool],
) -> tuple[np.ndarray, float, float, float, float]:
    """Bounded Nelder–Mead on the free parameters (log b_const, b_exp, log q_const, q_exp
    [, log m][, m_size_exp][, L̂]) from the grid optimum, restarted once; keeps the grid point
    if it is better."""
    from scipy.optimize import minimize  # imported here: the run-time predictor needs no scipy

    fit_l0 = l0_max > 0
    boxes = [
        (math.log(bounds.b_const[0]), math.log(bounds.b_const[1])), bounds.b_exp,
        (math.log(bounds.q_const[0]), math.log(bounds.q_const[1])), bounds.q_exp,
    ]
    x_all = [math.log(p[0]), p[1], math.log(p[2]), p[3]]
    x = [xi for xi, f in zip(x_all, free) if f]
    box = [bx for bx, f in zip(boxes, free) if f]
    if fit_m:
        x.append(math.log(mm))
        box.append((math.log(bounds.m[0]), math.log(bounds.m[1])))
    if fit_size:
        x.append(mn)
        box.append(bounds.m_size_exp)
    if fit_l0:
        x.append(l0)
        box.append((0.0, l0_max))

    def unpack(v: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        it = iter(v)
        full = [next(it) if f else x0 for f, x0 in zip(free, x_all)]
        m_ = math.exp(next(it)) if fit_m else mm
        n_ = float(next(it)) if fit_size else mn
        l_ = float(next(it)) if fit_l0 else l0
        pp = np.array([math.exp(full[0]), full[1], math.exp(full[2]), full[3]])
        # exp(log bound) can overshoot the bound by an ulp: clip back into the box.
        lo = [bounds.b_const[0], bounds.b_exp[0], bounds.q_const[0], bounds.q_exp[0]]
        hi = [bounds.b_const[1], bounds.b_exp[1], bounds.q_const[1], bounds.q_exp[1]]
        return np.clip(pp, lo, hi), float(np.clip(m_, *bounds.m)), n_, l_

    def objective(v: np.ndarray) -> float:
        return score(*unpack(v))

    start = np.clip(np.array(x), [b[0] for b in box], [b[1] for b in box])
    best_x = None
    for _ in range(2):
        res = minimize(
            objective, start, method="Nelder-Mead", bounds=box,
            options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000, "adaptive": start.size > 3},
        )
        if np.all(np.isfinite(res.x)) and res.fun < best:
            best_x, best, start = res.x, float(res.fun), res.x
    if best_x is None:
        return p, mm, mn, l0, best
    p_new, m_new, n_new, l_new = unpack(best_x)
    return p_new, m_new, n_new, l_new, best


def _bound_notes(
    p: np.ndarray, mm: float, l0: float, bounds: FitBounds, fit_m: bool, fit_l0: bool, l0_max: float
) -> list[str]:
    """Fit-log lines for parameters that ended on a bound (the data wanted more)."""
    notes = []

    def at_edge(value: float, lo: float, hi: float, log: bool) -> bool:
        a, b, v = (math.log(lo), math.log(hi), math.log(value)) if log else (lo, hi, value)
        return min(v - a, b - v) <= 1e-6 * max(1.0, b - a)

    checks = [("b_const", p[0], bounds.b_const, True), ("b_exp", p[1], bounds.b_exp, False),
              ("q_const", p[2], bounds.q_const, True), ("q_exp", p[3], bounds.q_exp, False)]
    if fit_m:
        checks.append(("m", mm, bounds.m, True))
    for name, value, (lo, hi), log in checks:
        if at_edge(float(value), lo, hi, log):
            notes.append(f"{name} = {float(value):.4g} is on its bound [{lo:g}, {hi:g}]")
    if fit_l0 and l0_max > 0 and l0 >= l0_max * (1 - 1e-6):
        notes.append(f"irreducible loss L̂ = {l0:.4g} is on its bound (0.9 × the lowest reference loss)")
    return notes


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
    if p.irreducible_loss and d.min_loss <= p.irreducible_loss:
        raise ValueError(
            f"score_curves: a curve reaches loss {d.min_loss:.4g}, at or below the predictor's "
            f"irreducible loss L̂ = {p.irreducible_loss:.4g}; this predictor cannot describe it"
        )
    b = np.asarray(p.b(d.tau), dtype=np.float64)
    q = np.asarray(p.q(d.tpp), dtype=np.float64)
    # m per curve: m(N) of the predictor's size term (m itself without one).
    m = (np.array([[p.m_at(curve_size(c))] for c in curves]) if p.has_size_term else p.m)
    surrogate_mae = _curve_mae(d, b, q, m, l0=p.irreducible_loss)
    # Reference-curve mode: ℓ is the calibrated runs' normalised curve (the surrogate only where
    # no reference matches), so score what the predictor itself draws. The oracle stays the
    # surrogate shape with b, q free per curve, started from the surrogate's fit in both modes:
    # the common yardstick.
    mae = surrogate_mae if predictor.references is None else _drawn_curve_mae(predictor, curves, d)
    log_b_axis, log_q_axis = _table_axes(bounds, table_size)
    ob, oq, oracle = _oracle(d, b, q, m, surrogate_mae, log_b_axis, log_q_axis, p.irreducible_loss)
    return CurveScores(mae, oracle, ob, oq)


def _drawn_curve_mae(predictor: Predictor, curves: Sequence[Curve], d: _Data) -> np.ndarray:
    """Per-curve MAE of what ``predictor.normalized_curve`` draws for each curve, normalised at
    its last point like :func:`_model`."""
    model = np.empty_like(d.ell)
    for i, c in enumerate(curves):
        controls = controls_with_size(c)
        model[i] = predictor.normalized_curve(d.grid, controls)
        if d.needs_last:
            model[i] /= predictor.normalized_curve(d.t_last[i], controls)
    return _model_mae(d, model, l0=predictor.params.irreducible_loss)


def _oracle(
    d: _Data,
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
        table = _table(d, log_b_axis, np.exp(lq), m, "b", l0)
        k = np.argmin(table, axis=0)
        cand = table[k, np.arange(table.shape[1])]
        better = cand < best
        lb = np.where(better, log_b_axis[k], lb)
        best = np.where(better, cand, best)
        table = _table(d, log_q_axis, np.exp(lb), m, "q", l0)
        k = np.argmin(table, axis=0)
        cand = table[k, np.arange(table.shape[1])]
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
            scores = _curve_mae(d, np.exp(cb), np.exp(cq), m, l0=l0)
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
            t, y = c.head(s)  # the cut a rung makes (predictors.curves.rung_cut)
            if t.size < predictor.align.min_points:
                continue
            try:
                pred = predictor.predict_final(t, y, controls_with_size(c)).final_loss
            except ValueError:  # e.g. a loss at or below the irreducible loss: no prediction
                continue
            # Compare at the curve's last point (t̂ = 1 for complete logs).
            t_last = float(c.t_hat[-1])
            at_last = float(predictor.loss_curve([t_last], controls_with_size(c), pred)[0])
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

    taus = [float(c.controls.tau) for c in curves if math.isfinite(c.controls.tau)]
    descriptive: dict[str, Any] = {
        "n_curves": len(curves),
        "model_sizes": uniq("n_params"),
        "tokens_per_param": sorted({float(c.controls.tokens_per_param) for c in curves}),
        # Finite τ only; curves without weight decay (τ = ∞) are counted apart.
        "tau_range": [min(taus), max(taus)] if taus else None,
        "taus": _distinct(np.array(taus)) if taus else [],
        "no_weight_decay_curves": sum(1 for c in curves if math.isinf(c.controls.tau)),
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
