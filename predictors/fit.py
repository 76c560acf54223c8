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

The parts, by concept: the curves on the grid and the objective (``predictors.fit_objective``),
the search's state, free mask and coordinate steps (``predictors.fit_search``), the oracle and
the scores of a fitted predictor (``predictors.fit_scores``); this module runs them in order
and packages the predictor.
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
from predictors.curves import Curve, controls_with_size
from predictors.fit_objective import COVER_TOL, FINAL_TOL, FitBounds, FitData, distinct, prepare, table_axes
from predictors.fit_scores import CurveScores, oracle, score_curves
from predictors.fit_search import (
    L0_MAX_FRACTION,
    MIN_SPAN,
    OUTSIDE_BOX,
    FitState,
    Search,
    alternate,
    bound_notes,
    clip_to_bounds,
    free_mask,
    identifiability,
    refine,
)
from predictors.predictor import DECISION_FRACTIONS, DecisionError, Predictor, package_version
from predictors.surrogate import SurrogateParams

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class FitSettings:
    """The settings of one fit (the keyword arguments of :func:`fit`), checked on creation.

    Args:
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
        size_term: fit the size term m(N) = m·(N/N_ref)^m_size_exp (``predictors.surrogate``)
            when every curve reports its N and the sizes span at least ``MIN_SPAN``×; with
            one size (or ``False``) m_size_exp stays 0, the paper's surrogate.
    """

    t_min: float = 0.2
    t_max: float = 1.0
    fit_m: bool = False
    m: float = equations.PAPER_M
    eps1: float = equations.PAPER_EPS1
    eps2: float = equations.PAPER_EPS2
    fit_irreducible: bool = False
    irreducible_loss: float = 0.0
    grid_points: int = 200
    grid_size: int = 41
    table_size: int = 241
    max_iterations: int = 10
    refine: bool = True
    bounds: FitBounds = field(default_factory=FitBounds)
    align: AlignSettings = field(default_factory=AlignSettings)
    decision_fractions: Sequence[float] = DECISION_FRACTIONS
    size_term: bool = True

    def __post_init__(self) -> None:
        if not (0.0 <= self.t_min < self.t_max <= 1.0):
            raise ValueError(f"fit: need 0 ≤ t_min < t_max ≤ 1, got t_min={self.t_min}, t_max={self.t_max}")
        if self.grid_points < 10 or self.grid_size < 5 or self.table_size < 20:
            raise ValueError("fit: grid_points ≥ 10, grid_size ≥ 5 and table_size ≥ 20 are required")
        for name, v in (("m", self.m), ("eps1", self.eps1), ("eps2", self.eps2)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"fit: {name} must be a finite number > 0, got {v!r}")
        if not (self.bounds.m[0] <= self.m <= self.bounds.m[1]):
            raise ValueError(f"fit: m = {self.m!r} is outside the bounds {self.bounds.m}")


#: The defaults of :func:`fit`'s keyword arguments: those of :class:`FitSettings`, one home.
_DEFAULT = FitSettings()


def fit(
    curves: Sequence[Curve],
    *,
    t_min: float = _DEFAULT.t_min,
    t_max: float = _DEFAULT.t_max,
    fit_m: bool = _DEFAULT.fit_m,
    m: float = _DEFAULT.m,
    eps1: float = _DEFAULT.eps1,
    eps2: float = _DEFAULT.eps2,
    fit_irreducible: bool = _DEFAULT.fit_irreducible,
    irreducible_loss: float = _DEFAULT.irreducible_loss,
    grid_points: int = _DEFAULT.grid_points,
    grid_size: int = _DEFAULT.grid_size,
    table_size: int = _DEFAULT.table_size,
    max_iterations: int = _DEFAULT.max_iterations,
    refine: bool = _DEFAULT.refine,
    bounds: Optional[FitBounds] = None,
    align: Optional[AlignSettings] = None,
    decision_fractions: Sequence[float] = _DEFAULT.decision_fractions,
    provenance: Optional[Mapping[str, Any]] = None,
    size_term: bool = _DEFAULT.size_term,
) -> FitResult:
    """Fit (b_const, b_exp, q_const, q_exp) — and m with ``fit_m=True`` — to reference curves.

    ``curves``: complete curves (each covering [t_min, t_max] and ending at t̂ ≥ 0.99),
    smoothed. The settings are those of :class:`FitSettings` (documented there);
    ``provenance`` is merged into the computed provenance (computed metrics win).

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
    curves = list(curves)
    if not curves:
        raise ValueError("fit: no curves")
    settings = FitSettings(
        t_min=t_min, t_max=t_max, fit_m=fit_m, m=m, eps1=eps1, eps2=eps2, fit_irreducible=fit_irreducible,
        irreducible_loss=irreducible_loss, grid_points=grid_points, grid_size=grid_size, table_size=table_size,
        max_iterations=max_iterations, refine=refine, bounds=bounds or FitBounds(), align=align or AlignSettings(),
        decision_fractions=decision_fractions, size_term=size_term)
    return fit_with(curves, settings, provenance)


def fit_with(curves: Sequence[Curve], settings: FitSettings,
             provenance: Optional[Mapping[str, Any]] = None) -> FitResult:
    """:func:`fit` with its settings as one :class:`FitSettings`: prepare the curves, fix what
    the bank cannot identify, search (alternating steps, then Nelder–Mead), clip into the box,
    then the oracle, the in-sample decision error and the packaged predictor."""
    t0 = time.perf_counter()
    s = settings
    curves = list(curves)
    if not curves:
        raise ValueError("fit: no curves")
    d = prepare(curves, s.t_min, s.t_max, s.grid_points, s.eps1, s.eps2)
    if not (math.isfinite(s.irreducible_loss) and 0.0 <= s.irreducible_loss < d.min_loss):
        raise ValueError(f"fit: irreducible_loss must be in [0, {d.min_loss:.4g}) (the lowest reference loss), "
                         f"got {s.irreducible_loss!r}")
    fixed, notes = identifiability(d, s.size_term)
    free = free_mask(fixed, fit_m=s.fit_m, size_term=s.size_term, fit_irreducible=s.fit_irreducible)
    l0_max = max(L0_MAX_FRACTION * d.min_loss, s.irreducible_loss) if s.fit_irreducible else 0.0
    search = Search(d, s.bounds, free, s.grid_size, l0_max, *table_axes(s.bounds, s.table_size))
    # Start from q = 1 for every curve.
    start = FitState(0.1, 0.0, 1.0, 0.0, float(s.m), 0.0, float(s.irreducible_loss))
    state, best, iterations = alternate(search, start, s.max_iterations)
    if s.refine:
        state, best = refine(search, state, best)
    state = clip_to_bounds(state, s.bounds)
    notes += bound_notes(state, search)
    for note in notes:
        logger.info("fit: %s", note)
    return _result(curves, s, search, state, fixed, notes, provenance, iterations, t0)


def _result(curves: list[Curve], s: FitSettings, search: Search, state: FitState, fixed: dict[str, str],
            notes: list[str], provenance: Optional[Mapping[str, Any]], iterations: int, t0: float) -> FitResult:
    """The fitted predictor at ``state``, its fit and oracle MAEs and its in-sample decision error."""
    d, free = search.d, search.free
    params = SurrogateParams(float(state.b_const), float(state.b_exp), float(state.q_const), float(state.q_exp),
                             float(state.m), s.eps1, s.eps2, float(state.irreducible), float(state.m_size_exp),
                             float(d.size_ref if free.m_size_exp else 1.0))
    curve_mae = state.curve_mae(d)
    if not np.all(np.isfinite(curve_mae)):  # the box makes this unreachable; never ship NaN
        raise ValueError("fit: the fitted surrogate is non-finite on the reference curves")
    ob, oq, oracle_curve = oracle(d, np.asarray(params.b(d.tau)), np.asarray(params.q(d.tpp)), state.m_curves(d),
                                  curve_mae, search.log_b_axis, search.log_q_axis, state.irreducible)
    fit_mae, oracle_mae = float(curve_mae.mean()), float(oracle_curve.mean())
    rel = _decision_errors(Predictor(params, bool(s.fit_m), s.align, None, {}), curves, s.decision_fractions)
    decision_error = None
    if rel:
        fr = sorted(rel)
        rms = [float(np.sqrt(np.nanmean(rel[f] ** 2))) for f in fr]
        bias = [float(np.nanmean(rel[f])) for f in fr]
        n_used = min(int(np.sum(np.isfinite(rel[f]))) for f in fr)
        decision_error = DecisionError(tuple(fr), tuple(rms), "rms", n_used, "in-sample", tuple(bias))
    prov = _provenance(curves, provenance, fit_mae, oracle_mae, s.t_min, s.t_max, s.grid_points, s.fit_m,
                       free.b_exp, free.q_exp)
    prov.update({"fixed_parameters": fixed, "fit_notes": list(notes),
                 "irreducible_loss_fitted": bool(s.fit_irreducible), "size_term": bool(free.m_size_exp)})
    predictor = Predictor(params, bool(s.fit_m), s.align, decision_error, prov)
    return FitResult(predictor, fit_mae, oracle_mae, curve_mae, oracle_curve, ob, oq, rel, iterations,
                     time.perf_counter() - t0, tuple(notes))


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
        "taus": distinct(np.array(taus)) if taus else [],
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


__all__ = ["COVER_TOL", "CurveScores", "FINAL_TOL", "FitBounds", "FitData", "FitResult", "FitSettings", "FitState",
           "L0_MAX_FRACTION", "MIN_SPAN", "OUTSIDE_BOX", "fit", "fit_with", "score_curves"]
