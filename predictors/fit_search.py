"""The fit's search: its state, which parameters are free, and the steps that move them.

The state (:class:`FitState`) is the surrogate's seven parameters at one point of the search:
(b_const, b_exp, q_const, q_exp) of Eq. 5, m (with the size exponent of m(N)) and the
irreducible loss L̂. The free mask (:class:`FreeMask`) says which of them the bank can
identify and the caller asked for (:func:`identifiability`); the rest stay at their start.

The alternating search (:func:`alternate`, paper App. D.1) runs the coordinate steps of
:data:`COORDINATE_STEPS` in order, each moving its parameters with the others fixed and kept
only when it lowers the objective, until an iteration stops improving; Nelder–Mead
(:func:`refine`) then polishes the free parameters together. Every point stays in the
physical box (``FitBounds``; a point where some reference curve's b or q leaves the
surrogate's box scores :data:`OUTSIDE_BOX`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from predictors.fit_objective import FitBounds, FitData, chunks, curve_mae, grid_scores, lookup, m_curves, table
from predictors.surrogate import B_BOX, Q_BOX

# An exponent is fitted only when its covariate (τ or TPP) spans at least this factor.
MIN_SPAN = 1.5
# The irreducible loss is searched in [0, L0_MAX_FRACTION · lowest reference loss].
L0_MAX_FRACTION = 0.9
# Objective value of a parameter point outside the box (no finite fit ever scores this).
OUTSIDE_BOX = 1e6


@dataclass(frozen=True)
class FreeMask:
    """Which parameters the fit moves: b_const always; the exponents unless the bank cannot
    identify them; q (q_const with q_exp) unless no curve's LR varies; m, the size exponent and
    L̂ only when asked for (and, for the size exponent, identifiable)."""

    b_exp: bool = True
    q_const: bool = True
    q_exp: bool = True
    m: bool = False
    m_size_exp: bool = False
    irreducible: bool = False

    @property
    def surrogate(self) -> tuple[bool, bool, bool, bool]:
        """The mask of (b_const, b_exp, q_const, q_exp)."""
        return True, self.b_exp, self.q_const, self.q_exp


@dataclass(frozen=True)
class FitState:
    """The surrogate's parameters at one point of the search (``predictors.surrogate``)."""

    b_const: float
    b_exp: float
    q_const: float
    q_exp: float
    m: float
    m_size_exp: float = 0.0
    irreducible: float = 0.0

    def b(self, d: FitData) -> np.ndarray:
        """b_i = b_const·τ_i^b_exp per curve."""
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return self.b_const * d.tau ** self.b_exp

    def q(self, d: FitData) -> np.ndarray:
        """q_i = q_const·TPP_i^q_exp per curve."""
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return self.q_const * d.tpp ** self.q_exp

    def m_curves(self, d: FitData) -> Any:
        """m per curve (m itself without a size term)."""
        return m_curves(d, self.m, self.m_size_exp)

    def curve_mae(self, d: FitData) -> np.ndarray:
        """The per-curve MAE at this point."""
        return curve_mae(d, self.b(d), self.q(d), self.m_curves(d), l0=self.irreducible)


@dataclass(frozen=True)
class Search:
    """What every step of one fit shares: the data, the box, the free mask, the grids."""

    d: FitData
    bounds: FitBounds
    free: FreeMask
    grid_size: int
    l0_max: float  # the top of L̂'s range (0 when L̂ is not fitted)
    log_b_axis: np.ndarray
    log_q_axis: np.ndarray

    def score(self, state: FitState) -> float:
        """The objective: the macro-averaged MAE, or OUTSIDE_BOX unless every reference curve's
        b and q lie in the surrogate's physical box (and the MAE is finite)."""
        b, q = state.b(self.d), state.q(self.d)
        if not np.all((b >= B_BOX[0]) & (b <= B_BOX[1]) & (q >= Q_BOX[0]) & (q <= Q_BOX[1])):
            return OUTSIDE_BOX
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            v = float(curve_mae(self.d, b, q, state.m_curves(self.d), l0=state.irreducible).mean())
        return v if math.isfinite(v) else OUTSIDE_BOX


# ---------------------------------------------------------------------- coordinate steps


def _size_step(s: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """The size exponent of m(N) = m·(N/N_ref)^m_size_exp on a grid, b and q fixed."""
    size_axis = np.linspace(s.bounds.m_size_exp[0], s.bounds.m_size_exp[1], 4 * s.grid_size + 1)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        b, q = state.b(s.d), state.q(s.d)
        scores = grid_scores(s.d, size_axis, lambda sizes: curve_mae(s.d, b, q, m_curves(s.d, state.m, sizes),
                                                                      l0=state.irreducible))
    scores = np.where(np.isfinite(scores), scores, OUTSIDE_BOX)
    k = int(np.argmin(scores))
    if float(scores[k]) < best:
        return replace(state, m_size_exp=float(size_axis[k])), float(scores[k])
    return state, best


def _b_step(s: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """(b_const, b_exp) on a 2-D grid with q fixed (per-curve tables in b)."""
    tab = table(s.d, s.log_b_axis, state.q(s.d), state.m_curves(s.d), "b", state.irreducible)
    lc, e = grid_pair(tab, s.log_b_axis, s.d.tau, s.bounds.b_const, s.bounds.b_exp, s.free.b_exp, s.grid_size)
    cand = replace(state, b_const=math.exp(lc), b_exp=e)
    return (cand, value) if (value := s.score(cand)) < best else (state, best)


def _q_step(s: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """(q_const, q_exp) on a 2-D grid with b fixed (per-curve tables in q)."""
    tab = table(s.d, s.log_q_axis, state.b(s.d), state.m_curves(s.d), "q", state.irreducible)
    lc, e = grid_pair(tab, s.log_q_axis, s.d.tpp, s.bounds.q_const, s.bounds.q_exp, s.free.q_exp, s.grid_size)
    cand = replace(state, q_const=math.exp(lc), q_exp=e)
    return (cand, value) if (value := s.score(cand)) < best else (state, best)


def _m_step(s: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """m on a log grid, b and q fixed."""
    ms = np.exp(np.linspace(math.log(s.bounds.m[0]), math.log(s.bounds.m[1]), 4 * s.grid_size))
    b, q = state.b(s.d), state.q(s.d)
    scores = grid_scores(s.d, ms, lambda m: curve_mae(s.d, b, q, m_curves(s.d, m, state.m_size_exp),
                                                      l0=state.irreducible))
    k = int(np.argmin(scores))
    if float(scores[k]) < best:
        return replace(state, m=float(ms[k])), float(scores[k])
    return state, best


def _irreducible_step(s: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """L̂ on a grid in [0, l0_max], everything else fixed."""
    l0s = np.linspace(0.0, s.l0_max, 4 * s.grid_size)
    b, q, m = state.b(s.d), state.q(s.d), state.m_curves(s.d)
    scores = grid_scores(s.d, l0s, lambda l0: curve_mae(s.d, b, q, m, l0=l0))
    k = int(np.argmin(scores))
    if float(scores[k]) < best:
        return replace(state, irreducible=float(l0s[k])), float(scores[k])
    return state, best


@dataclass(frozen=True)
class CoordinateStep:
    """One step of the alternating search: what it moves, whether the mask lets it run."""

    moves: str
    run: Callable[[Search, FitState, float], tuple[FitState, float]]
    applies: Callable[[FreeMask], bool]


#: The steps of one iteration, in order (the size exponent first: b and q are tabulated at it).
COORDINATE_STEPS: tuple[CoordinateStep, ...] = (
    CoordinateStep("m_size_exp", _size_step, lambda f: f.m_size_exp),
    CoordinateStep("b_const, b_exp", _b_step, lambda f: True),
    CoordinateStep("q_const, q_exp", _q_step, lambda f: f.q_const),
    CoordinateStep("m", _m_step, lambda f: f.m),
    CoordinateStep("irreducible", _irreducible_step, lambda f: f.irreducible),
)


def alternate(search: Search, state: FitState, max_iterations: int) -> tuple[FitState, float, int]:
    """The alternating search from ``state``: (state, objective, iterations run). Stops when an
    iteration improves the objective by less than a relative 1e-7."""
    steps = [step for step in COORDINATE_STEPS if step.applies(search.free)]
    best = search.score(state)
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        before = best
        for step in steps:
            state, best = step.run(search, state, best)
        if before - best <= 1e-7 * max(before, 1e-12):
            break
    return state, best, iterations


def grid_pair(
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
        # A few rows of the grid at a time: the whole (size, size, curves) grid held ~1.5 GB in
        # its temporaries at 17,682 curves.
        score = np.empty((lcs.size, es.size))
        step = chunks(lcs.size, es.size * log_x.size).step
        for k in range(0, lcs.size, step):
            x = lcs[k : k + step, None, None] + es[None, :, None] * log_x[None, None, :]
            score[k : k + step] = lookup(table, axis, x).mean(axis=-1)
        i, j = np.unravel_index(int(np.argmin(score)), score.shape)
        best = (float(lcs[i]), float(es[j]))
        # Zoom: ±2 grid cells around the best point.
        dlc = 2.0 * (lc_hi - lc_lo) / (size - 1)
        lc_lo, lc_hi = max(best[0] - dlc, box_lc[0]), min(best[0] + dlc, box_lc[1])
        if free_exp:
            de = 2.0 * (e_hi - e_lo) / (size - 1)
            e_lo, e_hi = max(best[1] - de, box_e[0]), min(best[1] + de, box_e[1])
    return best


# ---------------------------------------------------------------------- refinement


def _clip_surrogate(values: list[float], bounds: FitBounds) -> np.ndarray:
    """(b_const, b_exp, q_const, q_exp) clipped into the box."""
    lo = [bounds.b_const[0], bounds.b_exp[0], bounds.q_const[0], bounds.q_exp[0]]
    hi = [bounds.b_const[1], bounds.b_exp[1], bounds.q_const[1], bounds.q_exp[1]]
    return np.clip(np.array(values), lo, hi)


def _unpacker(search: Search, state: FitState) -> tuple[list[float], list[tuple[float, float]],
                                                         Callable[[np.ndarray], FitState]]:
    """The free parameters as Nelder–Mead's vector (log b_const, b_exp, log q_const, q_exp
    [, log m][, m_size_exp][, L̂]): its start, its box, and the state of a vector."""
    bounds, free = search.bounds, search.free
    boxes = [(math.log(bounds.b_const[0]), math.log(bounds.b_const[1])), bounds.b_exp,
             (math.log(bounds.q_const[0]), math.log(bounds.q_const[1])), bounds.q_exp]
    x_all = [math.log(state.b_const), state.b_exp, math.log(state.q_const), state.q_exp]
    x = [xi for xi, f in zip(x_all, free.surrogate) if f]
    box = [bx for bx, f in zip(boxes, free.surrogate) if f]
    if free.m:
        x.append(math.log(state.m))
        box.append((math.log(bounds.m[0]), math.log(bounds.m[1])))
    if free.m_size_exp:
        x.append(state.m_size_exp)
        box.append(bounds.m_size_exp)
    if free.irreducible:
        x.append(state.irreducible)
        box.append((0.0, search.l0_max))

    def unpack(v: np.ndarray) -> FitState:
        it = iter(v)
        full = [next(it) if f else x0 for f, x0 in zip(free.surrogate, x_all)]
        m_ = math.exp(next(it)) if free.m else state.m
        n_ = float(next(it)) if free.m_size_exp else state.m_size_exp
        l_ = float(next(it)) if free.irreducible else state.irreducible
        # exp(log bound) can overshoot the bound by an ulp: clip back into the box.
        p = _clip_surrogate([math.exp(full[0]), full[1], math.exp(full[2]), full[3]], bounds)
        return FitState(p[0], p[1], p[2], p[3], float(np.clip(m_, *bounds.m)), n_, l_)

    return x, box, unpack


def refine(search: Search, state: FitState, best: float) -> tuple[FitState, float]:
    """Bounded Nelder–Mead on the free parameters from the grid optimum, restarted once; keeps
    the grid point if it is better."""
    from scipy.optimize import minimize  # imported here: the run-time predictor needs no scipy

    x, box, unpack = _unpacker(search, state)
    start = np.clip(np.array(x), [b[0] for b in box], [b[1] for b in box])
    best_x = None
    for _ in range(2):
        res = minimize(
            lambda v: search.score(unpack(v)), start, method="Nelder-Mead", bounds=box,
            options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000, "adaptive": start.size > 3},
        )
        if np.all(np.isfinite(res.x)) and res.fun < best:
            best_x, best, start = res.x, float(res.fun), res.x
    return (state, best) if best_x is None else (unpack(best_x), best)


def clip_to_bounds(state: FitState, bounds: FitBounds) -> FitState:
    """Every saved parameter inside its bound (issue 15: a zoom once left the box)."""
    p = [state.b_const, state.b_exp, state.q_const, state.q_exp]
    clipped = _clip_surrogate(p, bounds)
    # The exponents fixed at 0 may lie outside a user's bounds that exclude 0: keep them at 0.
    clipped[1] = p[1] if p[1] == 0.0 else clipped[1]
    clipped[3] = p[3] if p[3] == 0.0 else clipped[3]
    # A fixed m (fit_m=False) was checked against the bounds on entry.
    mn = state.m_size_exp
    return FitState(clipped[0], clipped[1], clipped[2], clipped[3], float(np.clip(state.m, *bounds.m)),
                    float(np.clip(mn, *bounds.m_size_exp)) if mn != 0.0 else 0.0, state.irreducible)


# ---------------------------------------------------------------------- what the bank identifies


def identifiability(d: FitData, size_term: bool = True) -> tuple[dict[str, str], list[str]]:
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


def free_mask(fixed: dict[str, str], *, fit_m: bool, size_term: bool, fit_irreducible: bool) -> FreeMask:
    """The free mask of a fit: what was asked for, less what the bank cannot identify."""
    return FreeMask(b_exp="b_exp" not in fixed, q_const="q_const" not in fixed, q_exp="q_exp" not in fixed,
                    m=fit_m, m_size_exp=size_term and "m_size_exp" not in fixed, irreducible=fit_irreducible)


def bound_notes(state: FitState, search: Search) -> list[str]:
    """Fit-log lines for parameters that ended on a bound (the data wanted more)."""
    bounds, free = search.bounds, search.free
    notes = []

    def at_edge(value: float, lo: float, hi: float, log: bool) -> bool:
        a, b, v = (math.log(lo), math.log(hi), math.log(value)) if log else (lo, hi, value)
        return min(v - a, b - v) <= 1e-6 * max(1.0, b - a)

    checks = [("b_const", state.b_const, bounds.b_const, True), ("b_exp", state.b_exp, bounds.b_exp, False),
              ("q_const", state.q_const, bounds.q_const, True), ("q_exp", state.q_exp, bounds.q_exp, False)]
    if free.m:
        checks.append(("m", state.m, bounds.m, True))
    for name, value, (lo, hi), log in checks:
        if at_edge(float(value), lo, hi, log):
            notes.append(f"{name} = {float(value):.4g} is on its bound [{lo:g}, {hi:g}]")
    l0, l0_max = state.irreducible, search.l0_max
    if free.irreducible and l0_max > 0 and l0 >= l0_max * (1 - 1e-6):
        notes.append(f"irreducible loss L̂ = {l0:.4g} is on its bound (0.9 × the lowest reference loss)")
    mn, (lo, hi) = state.m_size_exp, bounds.m_size_exp
    if free.m_size_exp and (abs(mn - lo) < 1e-9 or abs(mn - hi) < 1e-9):
        notes.append(f"m_size_exp = {mn:.4g} is on its bound [{lo:g}, {hi:g}]")
    return notes


__all__ = ["COORDINATE_STEPS", "CoordinateStep", "FitState", "FreeMask", "L0_MAX_FRACTION", "MIN_SPAN",
           "OUTSIDE_BOX", "Search", "alternate", "bound_notes", "clip_to_bounds", "free_mask", "grid_pair",
           "identifiability", "refine"]
