"""The fit's objective: the reference curves on one grid, and the surrogate's MAE on it.

Every curve is resampled onto one uniform t̂ grid in the fit window, so the curves stack into a
(curves × grid) array and the macro-averaged MAE of ℓ̂ against ℓ = L/L(1) is one numpy
expression (:func:`curve_mae`). For fixed q a curve's MAE depends on its scalar b only (and
likewise for q), so the searches tabulate MAE_i(b) (MAE_i(q)) once on a log grid
(:func:`table`) and look a parameter point up by interpolation (:func:`lookup`). Shared by the
fit (``predictors.fit``, ``predictors.fit_search``) and the scores of fitted predictors
(``predictors.fit_scores``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from predictors import equations
from predictors.curves import Curve, curve_size, reaches_end
from predictors.surrogate import B_BOX, M_BOX, Q_BOX

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
    # The size term's exponent, m(N) = m·(N/N_ref)^m_size_exp (predictors.surrogate).
    m_size_exp: tuple[float, float] = (-1.0, 1.0)
    # Ranges of the per-curve MAE tables in b and q (the physical box of the surrogate).
    b_table: tuple[float, float] = B_BOX
    q_table: tuple[float, float] = Q_BOX


@dataclass
class FitData:
    """The reference curves on the fit's grid, with the covariates of b, q and m per curve."""

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


def prepare(curves: Sequence[Curve], t_min: float, t_max: float, grid_points: int, eps1: float, eps2: float) -> FitData:
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
        # The end is covered by a curve that reaches it (reaches_end: within one logging
        # interval, what the import and the fit call complete); the start within COVER_TOL.
        ends = t[-1] >= t_max - COVER_TOL or (t_max >= 1.0 - FINAL_TOL and reaches_end(t))
        if t[0] > t_min + COVER_TOL or not ends:
            raise ValueError(
                f"{label} covers t̂ ∈ [{t[0]:.3g}, {t[-1]:.3g}], not the fit window [{t_min:.3g}, {t_max:.3g}]"
            )
        if t[-1] < 1.0 - FINAL_TOL and not reaches_end(t):
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
    sizes_distinct = distinct(sizes[np.isfinite(sizes)])
    size_ref = float(np.exp(np.mean(np.log(sizes_distinct)))) if sizes_distinct else 1.0
    log_n = np.where(np.isfinite(sizes), np.log(np.where(np.isfinite(sizes), sizes, 1.0) / size_ref), 0.0)
    return FitData(grid, ell, eta, eta1, t_last, eta_last, bool(np.any(t_last < 1.0)), tau, tpp, log_n, size_ref,
                 known, int(no_decay.sum()), eps1, eps2, final, min_loss)


def distinct(values: np.ndarray, tolerance: float = 0.01) -> list[float]:
    """Distinct values (within a relative ``tolerance``), ascending."""
    out: list[float] = []
    for v in sorted(float(x) for x in values):
        if not out or abs(v / out[-1] - 1.0) > tolerance:
            out.append(v)
    return out


def model(d: FitData, b: np.ndarray, q: np.ndarray, m: Any, rows: Any = slice(None)) -> np.ndarray:
    """ℓ̂_i on the grid, normalised at each curve's last point; b, q of shape (..., C)."""
    bb = np.asarray(b)[..., None]
    qq = np.asarray(q)[..., None]
    out = equations.surrogate(d.grid, d.eta[rows], d.eta1[rows], bb, qq, m, d.eps1, d.eps2)
    if d.needs_last:
        out = out / equations.surrogate(
            d.t_last[rows], d.eta_last[rows], d.eta1[rows], bb, qq, m, d.eps1, d.eps2
        )
    return out


def curve_mae(
    d: FitData, b: np.ndarray, q: np.ndarray, m: Any, rows: Any = slice(None), l0: Any = 0.0
) -> np.ndarray:
    """Per-curve MAE in ℓ = L/L(1) units; b, q of shape (..., C) → (..., C).

    With an irreducible loss L̂ = ``l0`` (scalar, or shape (..., 1, 1)) the model of L/L(1) is
    r + (1 − r)·ℓ̂ with r = L̂/L(1) per curve (Eq. 1 with the offset, solved for L).
    """
    return model_mae(d, model(d, b, q, m, rows), rows, l0)


def model_mae(d: FitData, model: np.ndarray, rows: Any = slice(None), l0: Any = 0.0) -> np.ndarray:
    """Per-curve MAE of a modelled ℓ̂ on ``d``'s grid (normalised at each curve's last point)
    against the observed ℓ, with the irreducible loss ``l0`` as in :func:`curve_mae`."""
    if np.any(np.asarray(l0) != 0.0):
        model = equations.loss_ratio_from_normalized(model, d.final[rows], l0)
    return np.mean(np.abs(model - d.ell[rows]), axis=-1)


def chunks(k: int, per: int, budget: int = 2_000_000) -> range:
    return range(0, k, max(1, budget // max(per, 1)))


def grid_scores(d: FitData, axis: np.ndarray, score: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The objective (mean per-curve MAE) at each candidate of ``axis``: ``score(values)`` maps
    candidates shaped (k, 1, 1) to per-curve MAEs (k, C). Evaluated a few candidates at a time,
    so at most ~:func:`chunks`' budget of model values live at once: all 164 candidates of a
    17,682-curve fit at once held 164 x curves x grid values in each temporary (13 GB)."""
    out = np.empty(axis.size)
    step = chunks(axis.size, d.ell.size).step
    for k in range(0, axis.size, step):
        out[k : k + step] = score(axis[k : k + step, None, None]).mean(axis=-1)
    return out


def table(d: FitData, log_axis: np.ndarray, fixed: np.ndarray, m: float, vary: str, l0: float = 0.0) -> np.ndarray:
    """MAE_i(x) for each x in exp(log_axis), the other parameter fixed per curve → (K, C).

    ``vary`` is ``"b"`` (``fixed`` holds q_i) or ``"q"`` (``fixed`` holds b_i).
    """
    n, g = d.ell.shape
    out = np.empty((log_axis.size, n))
    step = chunks(log_axis.size, n * g).step
    for k in range(0, log_axis.size, step):
        xk = np.exp(log_axis[k : k + step])[:, None] * np.ones(n)
        other = np.broadcast_to(fixed, xk.shape)
        with np.errstate(over="ignore", under="ignore"):
            out[k : k + step] = (curve_mae(d, xk, other, m, l0=l0) if vary == "b"
                                 else curve_mae(d, other, xk, m, l0=l0))
    return out


def lookup(table: np.ndarray, axis: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Linear interpolation of per-curve tables (K, C) at x (..., C) on a uniform axis (clamped)."""
    k = axis.size
    pos = np.clip((x - axis[0]) / (axis[1] - axis[0]), 0.0, k - 1.0)
    i0 = np.minimum(pos.astype(np.int64), k - 2)
    f = pos - i0
    cols = np.arange(table.shape[1])
    return table[i0, cols] * (1.0 - f) + table[i0 + 1, cols] * f



def m_curves(d: FitData, mm: Any, mn: Any) -> Any:
    """m per curve, m·(N_i/N_ref)^mn clipped into ``M_BOX``, shaped to broadcast against the
    (..., curves, grid) model: the scalar ``mm`` itself without a size term. ``mm`` and ``mn``
    may carry leading grid axes (..., 1, 1)."""
    if np.ndim(mn) == 0 and float(mn) == 0.0:
        return mm
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        factor = np.exp(np.asarray(mn) * d.log_n[:, None])
    return np.clip(np.asarray(mm) * factor, *M_BOX)



def table_axes(bounds: FitBounds, table_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The log b and log q axes of the per-curve MAE tables (shared by the fit and the oracle)."""
    log_b_axis = np.linspace(math.log(bounds.b_table[0]), math.log(bounds.b_table[1]), table_size)
    log_q_axis = np.linspace(math.log(bounds.q_table[0]), math.log(bounds.q_table[1]), table_size)
    return log_b_axis, log_q_axis

