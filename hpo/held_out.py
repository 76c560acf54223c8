"""Held-out errors of the predictor: leave-one-out and across scales, and interval coverage.

A calibration states how wrong a predicted final loss can be at a stop fraction s (e(s), the
``DecisionError`` a predictor carries). That statement is only worth what it was measured on:

* **leave-one-out** (refit without each curve, predict it): the error for a new run *at the
  calibrated scale* (the same model sizes, TPPs and τ as the bank);
* **across scales, per held-out group** (issue 15): along each axis (TPP, model size N, τ) the
  bank holds two or more values of, refit without every curve of one value and predict those
  (leave-one-group-out: interior and end values), and refit on the values up to (down from)
  each one and predict every value beyond (extrapolation: distances as far as the bank
  allows). Every held-out group keeps its error and where it lay
  (``predictors.ranking.Position``); a run off the calibrated scale gets the error of the
  groups in the same situation at least as far away, grown with distance beyond them
  (``predictors.distance``). The pooled RMS of each leave-one-group-out grouping is kept as
  ``DecisionError.cross_scale`` for files and axes without groups.

**Size in the prediction** (issue 15): where the bank spans two or more model sizes,
:func:`choose_size_method` predicts every size leave-one-size-out with the plain surrogate,
the surrogate with a size term, and reference curves interpolated in log N (held, or
extrapolated along the size term, beyond the calibrated sizes), and the calibration ships the
simplest one unless a more complex one beats it by more than the noise of the comparison
(:func:`pick_within_noise`).

**Coverage** is the check of a stated interval: the fraction of held-out true finals inside
prediction ± z·σ, with σ = L̂(T)·sqrt(residual² + e(s)²) as ``Predictor.predict_final`` states it
(``z = 2`` should cover ~95% if the errors were Gaussian with the stated σ). Per held-out group
it is judged with the error stated by the groups *other* than it (:func:`group_coverage`), so
the check is not in-sample.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from predictors import Curve, fit
from predictors.curves import controls_with_size, curve_size, rung_cut
from predictors.distance import ErrorGroup, off_scale_error
from predictors.predictor import DECISION_FRACTIONS, DecisionError, Predictor
from predictors.ranking import Position
from predictors.references import ReferenceCurves

# Two TPPs (model sizes, τ) within this relative distance are one group.
GROUP_TOLERANCE = 0.01
# Groupings across scales: the name used in tables, and the curve value that defines a group.
SCALE_GROUPINGS: dict[str, Callable[[Curve], Optional[float]]] = {
    "leave-one-TPP-out": lambda c: float(c.controls.tokens_per_param),
    "leave-one-size-out": curve_size,
    "leave-one-τ-out": lambda c: float(c.controls.tau) if math.isfinite(c.controls.tau) else None,
}
#: The axis of each grouping (``predictors.ranking.Position.axis``) and its name in words.
SCALE_AXES: dict[str, str] = {"leave-one-TPP-out": "tokens_per_param", "leave-one-size-out": "n_params",
                              "leave-one-τ-out": "tau"}
AXIS_WORDS: dict[str, str] = {"tokens_per_param": "TPP", "n_params": "size", "tau": "τ"}
#: Values on an axis must span this factor for the size comparison (as the fit's size term).
MIN_SIZE_SPAN = 1.5
#: The stop fractions that judge a size method (the decision fractions, as the mode choice).
CHOICE_FRACTIONS_MAX = 0.3


@dataclass(frozen=True)
class Method:
    """How a refit predicts: the ``fit`` keyword arguments, and whether reference curves of
    the refit's own curves are attached (their extrapolation beyond the calibrated sizes:
    ``"hold"`` or ``"surrogate"``; ``predictors.references``)."""

    name: str
    fit_items: tuple[tuple[str, Any], ...] = ()
    references: Optional[str] = None

    @classmethod
    def of(cls, name: str, fit_kwargs: Mapping[str, Any], references: Optional[str] = None) -> "Method":
        return cls(name, tuple(sorted(dict(fit_kwargs).items())), references)

    @property
    def fit_kwargs(self) -> dict[str, Any]:
        return dict(self.fit_items)


def size_methods(fit_kwargs: Mapping[str, Any]) -> list[Method]:
    """The ways model size can enter a prediction, compared by :func:`choose_size_method`,
    simplest first (the fallback of :func:`pick_within_noise`): the calibrated curve of the
    nearest size, held beyond the calibrated sizes (the nearest-width rule: no size trend, the
    shape measured closest to the run); one shape for every size (the plain surrogate, pooled
    over sizes); then the two that continue a fitted size trend m(N) beyond the calibrated
    sizes (the size term; reference curves along it), which overshoot more the farther they go
    when the trend is fitted on few sizes (issue 28)."""
    plain = {**dict(fit_kwargs), "size_term": False}
    sized = {**dict(fit_kwargs), "size_term": True}
    return [Method.of("reference curves", sized, "hold"), Method.of("surrogate", plain),
            Method.of("size term", sized), Method.of("reference curves, size-term trend", sized, "surrogate")]


class Refits:
    """Refits of one bank without some of its curves, shared by every held-out measurement of a
    calibration (a leave-one-size-out refit serves the size comparison, the decision error
    and the ranking error alike)."""

    def __init__(self, curves: Sequence[Curve]) -> None:
        self.curves = list(curves)
        self._fits: dict[tuple[Any, ...], Predictor] = {}

    def __len__(self) -> int:
        return len(self._fits)

    def predictor(self, keep: Sequence[int], method: Method) -> Predictor:
        key = (tuple(sorted(keep)), method.fit_items)
        if key not in self._fits:
            self._fits[key] = fit([self.curves[i] for i in key[0]], decision_fractions=(),
                                  **method.fit_kwargs).predictor
        predictor = self._fits[key]
        if method.references is not None:
            refs = ReferenceCurves.from_curves([self.curves[i] for i in key[0]], extrapolation=method.references)  # type: ignore[arg-type]
            predictor = dataclasses.replace(predictor, references=refs)
        return predictor


def _method(fit_kwargs: Optional[Mapping[str, Any]], method: Optional[Method], scheme: str) -> Method:
    if method is not None:
        return method
    return Method.of(scheme, dict(fit_kwargs or {}))


def _tick(progress: Optional[Callable[[str], None]], label: str, done: int, total: int) -> None:
    """Progress every ~10% of a long loop (and at its end), so a 60-refit leave-one-out prints
    about ten lines, not sixty."""
    if progress is not None and (done == total or done % max(1, total // 10) == 0):
        progress(f"{label}: {done}/{total} refits")


@dataclass(frozen=True, eq=False)
class GroupPredictions:
    """Predictions of one held-out group (a TPP, size or τ) by a refit that did not see it.

    Attributes:
        scheme: ``leave-one-size-out`` (…) or ``size extrapolation upward`` (calibrated on the
            smaller sizes) / ``downward`` (on the larger), and likewise for TPP and τ.
        value: the group's value on the axis.
        position: where it lay against the values the refit saw.
        members: its curves (indices into the bank).
        predicted, residual: (len(fractions), len(members)); NaN where none was made.
        truth: (len(members),) true finals.
    """

    scheme: str
    value: float
    position: Position
    members: tuple[int, ...]
    predicted: np.ndarray
    residual: np.ndarray
    truth: np.ndarray

    def rel_errors(self) -> np.ndarray:
        return self.predicted / self.truth[None, :] - 1.0

    def rms(self) -> list[float]:
        return [float(np.sqrt(np.nanmean(r ** 2))) if np.isfinite(r).any() else float("nan")
                for r in self.rel_errors()]

    def bias(self) -> list[float]:
        return [float(np.nanmean(r)) if np.isfinite(r).any() else float("nan") for r in self.rel_errors()]

    def error_group(self, keep: Sequence[int]) -> Optional[ErrorGroup]:
        """The :class:`ErrorGroup` at the fraction indices ``keep``; None where any is unmeasured."""
        rms, bias = self.rms(), self.bias()
        if not all(np.isfinite(rms[k]) for k in keep):
            return None
        n = int(min(np.isfinite(self.predicted[k]).sum() for k in keep))
        return ErrorGroup(self.scheme, self.value, self.position, max(n, 1),
                          tuple(rms[k] for k in keep), tuple(bias[k] for k in keep))


@dataclass(frozen=True, eq=False)
class HeldOutPredictions:
    """Final losses predicted for curves a refit did not see, at each stop fraction.

    Attributes:
        scheme: how the curves were held out (``leave-one-out``, ``leave-one-TPP-out``, ...).
        fractions: the stop fractions s.
        predicted: (len(fractions), n) predicted final loss; NaN where no prediction was made.
        residual: the alignment residual of each prediction (relative), same shape.
        truth: (n,) the true final losses.
        n_groups: how many groups were held out in turn.
        groups: per held-out group (leave-one-group-out and extrapolation) its predictions and
            position (empty for leave-one-out).
    """

    scheme: str
    fractions: tuple[float, ...]
    predicted: np.ndarray
    residual: np.ndarray
    truth: np.ndarray
    n_groups: int
    groups: tuple[GroupPredictions, ...] = ()

    def rel_errors(self) -> np.ndarray:
        """(k, n) predicted / true − 1."""
        return self.predicted / self.truth[None, :] - 1.0

    def rms(self) -> list[float]:
        """RMS relative error per stop fraction (NaN where nothing was predicted)."""
        err = self.rel_errors()
        return [float(np.sqrt(np.nanmean(row**2))) if np.isfinite(row).any() else float("nan") for row in err]

    def bias(self) -> list[float]:
        """Mean relative error per stop fraction."""
        return [float(np.nanmean(row)) if np.isfinite(row).any() else float("nan") for row in self.rel_errors()]

    def coverage(self, errors: Sequence[float], z: float) -> list[float]:
        """Fraction of predictions with |predicted − true| ≤ z·σ, σ = predicted·sqrt(r² + e(s)²),
        for the stated errors e(s) (one per stop fraction). NaN where nothing was predicted."""
        out = []
        for k, e in enumerate(errors):
            pred, res = self.predicted[k], self.residual[k]
            ok = np.isfinite(pred)
            if not ok.any():
                out.append(float("nan"))
                continue
            sigma = pred[ok] * np.sqrt(res[ok] ** 2 + float(e) ** 2)
            out.append(float(np.mean(np.abs(pred[ok] - self.truth[ok]) <= z * sigma)))
        return out


def predict_at(predictor: Any, curve: Curve, stop_fraction: float) -> Optional[Any]:
    """The ``Prediction`` from the curve's points up to the first at or past s — the cut the
    scheduler makes at a rung — or None when there is none (too few points, or the predictor
    refuses the run, e.g. losses below its irreducible loss). The curve's N (its meta) goes
    with its controls, as our trainable reports it."""
    n = rung_cut(curve.t_hat, stop_fraction)
    if n is None or n < predictor.align.min_points:
        return None
    try:
        return predictor.predict_final(curve.t_hat[:n], curve.loss[:n], controls_with_size(curve))
    except ValueError:
        return None


def prediction_at(predictor: Any, curve: Curve, stop_fraction: float) -> tuple[float, float]:
    """(predicted final, residual) of :func:`predict_at`, or (NaN, NaN) without a prediction."""
    pred = predict_at(predictor, curve, stop_fraction)
    return (float("nan"), float("nan")) if pred is None else (float(pred.final_loss), float(pred.residual))


def held_out_predictions(
    curves: Sequence[Curve],
    groups: Sequence[Sequence[int]],
    scheme: str,
    *,
    fit_kwargs: Optional[Mapping[str, Any]] = None,
    fractions: Sequence[float] = DECISION_FRACTIONS,
    progress: Optional[Callable[[str], None]] = None,
    method: Optional[Method] = None,
    refits: Optional[Refits] = None,
) -> HeldOutPredictions:
    """Refit without each group of curves (indices into ``curves``) and predict the group.

    A group whose complement holds fewer than 2 curves is skipped (its predictions stay NaN).
    The refit is ``method``'s (or :func:`predictors.fit` with ``fit_kwargs``: ``t_min``,
    ``fit_m``, ``fit_irreducible``, ``size_term``), through ``refits`` when given (shared).
    """
    curves = list(curves)
    method = _method(fit_kwargs, method, scheme)
    refits = refits if refits is not None else Refits(curves)
    fractions = tuple(float(s) for s in fractions)
    predicted = np.full((len(fractions), len(curves)), np.nan)
    residual = np.full_like(predicted, np.nan)
    for g, members in enumerate(groups):
        held = set(members)
        rest = [j for j in range(len(curves)) if j not in held]
        if len(rest) >= 2:
            predictor = refits.predictor(rest, method)
            for i in members:
                for k, s in enumerate(fractions):
                    predicted[k, i], residual[k, i] = prediction_at(predictor, curves[i], s)
        _tick(progress, f"{scheme} ({method.name})", g + 1, len(groups))
    truth = np.array([c.final_loss for c in curves], dtype=np.float64)
    return HeldOutPredictions(scheme, fractions, predicted, residual, truth, len(groups))


def groups_of(curves: Sequence[Curve], value: Callable[[Curve], Optional[float]]) -> list[list[int]]:
    """Indices of curves grouped by ``value`` (equal within ``GROUP_TOLERANCE``); curves whose
    value is unknown form no group (they are never held out, always fitted on)."""
    groups: list[tuple[float, list[int]]] = []
    for i, curve in enumerate(curves):
        v = value(curve)
        if v is None or not np.isfinite(v):
            continue
        for ref, members in groups:
            if abs(v / ref - 1.0) <= GROUP_TOLERANCE:
                members.append(i)
                break
        else:
            groups.append((v, [i]))
    return [members for _, members in sorted(groups)]


def leave_one_out(curves: Sequence[Curve], *, fit_kwargs: Optional[Mapping[str, Any]] = None,
                  fractions: Sequence[float] = DECISION_FRACTIONS, method: Optional[Method] = None,
                  refits: Optional[Refits] = None,
                  progress: Optional[Callable[[str], None]] = None) -> HeldOutPredictions:
    """Every curve held out once."""
    return held_out_predictions(curves, [[i] for i in range(len(curves))], "leave-one-out",
                                fit_kwargs=fit_kwargs, fractions=fractions, method=method, refits=refits,
                                progress=progress)


def axis_predictions(
    curves: Sequence[Curve], scheme: str, *, fit_kwargs: Optional[Mapping[str, Any]] = None,
    fractions: Sequence[float] = DECISION_FRACTIONS, method: Optional[Method] = None,
    refits: Optional[Refits] = None, progress: Optional[Callable[[str], None]] = None,
    extrapolate: bool = True,
) -> Optional[HeldOutPredictions]:
    """Leave-one-group-out along the axis of ``scheme`` (a key of :data:`SCALE_GROUPINGS`), and
    with ``extrapolate`` the extrapolation refits: calibrated on the values up to each one (down
    from each one), every value beyond predicted, so held-out distances reach as far as the bank
    allows. Refits that would repeat a leave-one-group-out refit (only the end value beyond) are
    not made twice. None when the bank holds fewer than two values on the axis.

    The returned :class:`HeldOutPredictions` holds the leave-one-group-out predictions (one per
    curve) and, in ``groups``, every held-out group of both kinds with its position."""
    curves = list(curves)
    axis = SCALE_AXES[scheme]
    groups = groups_of(curves, SCALE_GROUPINGS[scheme])
    if len(groups) < 2:
        return None
    method = _method(fit_kwargs, method, scheme)
    refits = refits if refits is not None else Refits(curves)
    fractions = tuple(float(s) for s in fractions)
    values = [float(SCALE_GROUPINGS[scheme](curves[g[0]])) for g in groups]  # type: ignore[arg-type]
    truth = np.array([c.final_loss for c in curves], dtype=np.float64)
    predicted = np.full((len(fractions), len(curves)), np.nan)
    residual = np.full_like(predicted, np.nan)
    # (calibrated group indices, predicted group indices, scheme) for every refit.
    plans = [([j for j in range(len(groups)) if j != i], [i], scheme) for i in range(len(groups))]
    n = len(groups)
    if extrapolate and n >= 3:
        words = AXIS_WORDS[axis]
        plans += [(list(range(j + 1)), list(range(j + 1, n)), f"{words} extrapolation upward") for j in range(n - 2)]
        plans += [(list(range(j, n)), list(range(j)), f"{words} extrapolation downward") for j in range(2, n)]
    out: list[GroupPredictions] = []
    for step, (calibrated, held, name) in enumerate(plans):
        keep = [i for j in calibrated for i in groups[j]]
        if len(keep) >= 2:
            predictor = refits.predictor(keep, method)
            seen = [values[j] for j in calibrated]
            for j in held:
                position = Position.of(values[j], seen, axis)
                if position is None:
                    continue
                members = groups[j]
                pr = np.full((len(fractions), len(members)), np.nan)
                rs = np.full_like(pr, np.nan)
                for col, i in enumerate(members):
                    for k, s in enumerate(fractions):
                        pr[k, col], rs[k, col] = prediction_at(predictor, curves[i], s)
                if name == scheme:
                    predicted[:, members], residual[:, members] = pr, rs
                out.append(GroupPredictions(name, values[j], position, tuple(members), pr, rs, truth[members]))
        _tick(progress, f"{scheme} and extrapolation ({method.name})", step + 1, len(plans))
    return HeldOutPredictions(scheme, fractions, predicted, residual, truth, n, tuple(out))


def across_scales(curves: Sequence[Curve], *, fit_kwargs: Optional[Mapping[str, Any]] = None,
                  fractions: Sequence[float] = DECISION_FRACTIONS, method: Optional[Method] = None,
                  refits: Optional[Refits] = None, progress: Optional[Callable[[str], None]] = None,
                  extrapolate: bool = True, schemes: Optional[Sequence[str]] = None) -> list[HeldOutPredictions]:
    """One :class:`HeldOutPredictions` per grouping in ``SCALE_GROUPINGS`` (or ``schemes``) that
    has at least two groups in the bank (a bank of one model size gives no leave-one-size-out),
    each with its held-out groups (:func:`axis_predictions`)."""
    out = []
    for scheme in schemes or SCALE_GROUPINGS:
        held = axis_predictions(curves, scheme, fit_kwargs=fit_kwargs, fractions=fractions, method=method,
                                refits=refits, progress=progress, extrapolate=extrapolate)
        if held is not None:
            out.append(held)
    return out


def spans_sizes(curves: Sequence[Curve]) -> bool:
    """Whether the bank holds two or more model sizes at least ``MIN_SIZE_SPAN``× apart."""
    sizes = [n for n in (curve_size(c) for c in curves) if n is not None]
    return len(sizes) == len(list(curves)) and bool(sizes) and max(sizes) / min(sizes) >= MIN_SIZE_SPAN


#: A method more complex than another is chosen only when its leave-one-size-out score is lower
#: by more than this many standard errors of the paired per-size difference (issue 28).
CHOICE_NOISE_Z = 2.0


@dataclass(frozen=True, eq=False)
class SizeChoice:
    """The leave-one-size-out comparison of :func:`size_methods`: each method's predictions
    (with its held-out groups) and score, the chosen one and why (:func:`pick_within_noise`)."""

    chosen: Method
    held: Mapping[str, HeldOutPredictions]
    scores: Mapping[str, float]
    why: str = ""


def choose_size_method(
    curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any], fractions: Sequence[float] = DECISION_FRACTIONS,
    refits: Optional[Refits] = None, progress: Optional[Callable[[str], None]] = None,
) -> SizeChoice:
    """How model size enters the shipped predictor, chosen by leave-one-size-out.

    Every :func:`size_methods` entry predicts each size from a refit without it (and, for the
    report, the extrapolation refits); the score is :func:`size_score`, and the choice
    :func:`pick_within_noise`: the simplest method whose score is within its noise of the
    lowest (a method more complex than another is chosen only when it beats it by more than
    the noise of the comparison).
    A bank of one size (or sizes within ``MIN_SIZE_SPAN``×) cannot compare them: the plain
    surrogate is chosen, with no predictions.
    """
    methods = size_methods(fit_kwargs)
    surrogate = next(m for m in methods if m.name == "surrogate")
    if not spans_sizes(curves):
        return SizeChoice(surrogate, {}, {}, "one model size: the plain surrogate")
    refits = refits if refits is not None else Refits(curves)
    held: dict[str, HeldOutPredictions] = {}
    scores: dict[str, float] = {}
    for method in methods:
        h = axis_predictions(curves, "leave-one-size-out", fractions=fractions, method=method, refits=refits,
                             progress=progress)
        if h is None:
            continue
        held[method.name] = h
        scores[method.name] = size_score(h)
    if not scores:
        return SizeChoice(surrogate, {}, {}, "no size held out: the plain surrogate")
    name, why = pick_within_noise({m.name: size_scores(held[m.name]) for m in methods if m.name in held})
    return SizeChoice(next(m for m in methods if m.name == name), held, scores, why)


def size_scores(held: HeldOutPredictions) -> dict[float, float]:
    """Per held-out size (its N), the mean over s ≤ 0.3 of its RMS relative error, from the
    leave-one-size-out groups (NaN where none was predicted)."""
    out = {}
    for g in held.groups:
        if g.scheme != held.scheme:
            continue
        r = [r for s, r in zip(held.fractions, g.rms()) if s <= CHOICE_FRACTIONS_MAX + 1e-9 and np.isfinite(r)]
        out[float(g.value)] = float(np.mean(r)) if r else float("nan")
    return out


def size_score(held: HeldOutPredictions) -> float:
    """The mean over held-out sizes of :func:`size_scores`: every size counts once, so a size
    with many curves (the reference size of a bank, typically) does not drown the end sizes."""
    values = [v for v in size_scores(held).values() if np.isfinite(v)]
    return float(np.mean(values)) if values else math.inf


def pick_within_noise(per_size: Mapping[str, Mapping[float, float]], z: float = CHOICE_NOISE_Z) -> tuple[str, str]:
    """(the chosen method, the rule in words) from each method's score per held-out size,
    methods in order of simplicity (the first the simplest).

    The rule (issue 28): the method with the lowest mean score is the best; a simpler method
    is chosen instead unless the best beats it by more than the noise of the comparison, i.e.
    unless the mean of the paired per-size differences (simpler − best, over the sizes both
    predicted) exceeds ``z`` standard errors of that mean. With fewer than 2 sizes in common the
    noise is unknown, and the simpler method stands. With a handful of sizes and one seed per
    size, a lower mean is often one size's luck; this keeps a fitted size trend out unless it
    wins at every size held out by about the same margin."""
    names = list(per_size)
    means = {n: float(np.nanmean(list(v.values()))) if any(np.isfinite(list(v.values()))) else math.inf
             for n, v in per_size.items()}
    best = min(names, key=lambda n: (means[n], names.index(n)))
    for name in names[:names.index(best)]:
        common = [n for n in per_size[name] if n in per_size[best]
                  and np.isfinite(per_size[name][n]) and np.isfinite(per_size[best][n])]
        d = np.array([per_size[name][n] - per_size[best][n] for n in common])
        noise = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) >= 2 else math.inf
        gain = float(np.mean(d)) if len(d) else math.nan
        if not (gain > z * noise):
            return name, (f"{name}: {best} scored lower ({100 * means[best]:.2f}% against {100 * means[name]:.2f}%), "
                          f"but by {100 * gain:.2f}%, within {z:g} standard errors ({100 * z * noise:.2f}%) of the "
                          f"paired difference over {len(d)} held-out sizes: the simpler method")
    return best, (f"{best}: the lowest score ({100 * means[best]:.2f}%), lower than every simpler method by more "
                  f"than {z:g} standard errors of the paired difference over the held-out sizes"
                  if names.index(best) else f"{best}: the lowest score ({100 * means[best]:.2f}%)")


def decision_error_table(in_scale: HeldOutPredictions, cross: Sequence[HeldOutPredictions] = ()) -> DecisionError:
    """The ``DecisionError`` a predictor ships: RMS of ``in_scale`` per stop fraction; as
    ``cross_scale`` the larger RMS of the leave-one-group-out groupings (where any was
    measured); and every held-out group of ``cross`` with its position (``groups``), from which
    a run off the calibrated scale gets its error (``predictors.distance``)."""
    rms, bias = in_scale.rms(), in_scale.bias()
    keep = [k for k, v in enumerate(rms) if np.isfinite(v)]
    if not keep:
        raise ValueError(f"{in_scale.scheme}: no held-out prediction at any stop fraction")
    cross_rms = None
    source = None
    measured = [c for c in cross if any(np.isfinite(c.rms()[k]) for k in keep)]
    if measured:
        per = np.array([[c.rms()[k] for k in keep] for c in measured])
        with np.errstate(invalid="ignore"):
            worst = np.nanmax(per, axis=0) if np.isfinite(per).any() else per[0]
        # A fraction no grouping predicted falls back to the in-scale error.
        cross_rms = tuple(float(w) if np.isfinite(w) else float(rms[k]) for w, k in zip(worst, keep))
        source = "larger of " + ", ".join(f"{c.scheme} ({c.n_groups} groups)" for c in measured)
        if len(measured) == 1:
            source = f"{measured[0].scheme} ({measured[0].n_groups} groups)"
    index = {s: k for k, s in enumerate(in_scale.fractions)}
    groups = []
    for c in cross:
        if tuple(c.fractions) != tuple(in_scale.fractions):
            continue
        for g in c.groups:
            eg = g.error_group([index[in_scale.fractions[k]] for k in keep])
            if eg is not None:
                groups.append(dataclasses.replace(eg, direction=group_direction(g, c)))
    return DecisionError(
        tuple(in_scale.fractions[k] for k in keep), tuple(rms[k] for k in keep), "rms",
        len(in_scale.truth), in_scale.scheme, tuple(bias[k] for k in keep), cross_rms, source, tuple(groups),
    )


def group_direction(group: GroupPredictions, held: HeldOutPredictions) -> Optional[str]:
    """Where a group held out beyond the calibrated range lay: "above" its largest value or
    "below" its smallest (None inside). Extrapolation upward predicts above, downward below; a
    leave-one-group-out end group is above when it is the largest value of its axis."""
    if group.position.inside:
        return None
    if "upward" in group.scheme:
        return "above"
    if "downward" in group.scheme:
        return "below"
    values = [g.value for g in held.groups if g.scheme == group.scheme]
    return "above" if group.value >= max(values) else "below"


def group_coverage(table: DecisionError, cross: Sequence[HeldOutPredictions], z: float = 2.0) -> list[dict[str, Any]]:
    """Per held-out group: its RMS and bias per s, the e(s) stated for it by the error model of
    the *other* groups (an out-of-sample check of the distance model) and the fraction of its
    true finals inside ±z·σ with that e(s). Rows sorted by axis, scheme and distance."""
    fractions = list(table.stop_fractions)
    rows = []
    for c in cross:
        for g in c.groups:
            if list(c.fractions[:len(fractions)]) != fractions and not all(s in c.fractions for s in fractions):
                continue
            others = [e for e in table.groups if not (e.scheme == g.scheme and e.value == g.value
                                                       and e.position == g.position)]
            row: dict[str, Any] = {"scheme": g.scheme, "axis": g.position.axis, "value": g.value,
                                   "inside": g.position.inside, "distance": g.position.distance,
                                   "n": len(g.members), "by_s": {}}
            rms, bias = g.rms(), g.bias()
            for s in fractions:
                k = list(c.fractions).index(s)
                e_in = table.at(s)
                stated, _, _ = off_scale_error(others, fractions, s, e_in, [g.position],
                                               {g.position.axis: group_direction(g, c) or ""})
                stated = e_in if stated is None else stated
                pred, res, truth = g.predicted[k], g.residual[k], g.truth
                ok = np.isfinite(pred)
                sigma = pred[ok] * np.sqrt(res[ok] ** 2 + stated ** 2)
                cover = float(np.mean(np.abs(pred[ok] - truth[ok]) <= z * sigma)) if ok.any() else float("nan")
                row["by_s"][f"{s:g}"] = {"rms": rms[k], "bias": bias[k], "stated": stated, f"{z:g}σ": cover,
                                         "n": int(ok.sum())}
            rows.append(row)
    rows.sort(key=lambda r: (r["axis"], r["scheme"], r["distance"], r["value"]))
    return rows


def coverage_table(
    held_out: HeldOutPredictions, stated: Mapping[str, Sequence[float]], zs: Sequence[float] = (1.0, 2.0)
) -> dict[str, dict[str, dict[str, float]]]:
    """{label of the stated e(s): {"s": {"1σ": coverage, "2σ": coverage}}} for JSON reports."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, errors in stated.items():
        table: dict[str, dict[str, float]] = {}
        per_z = {z: held_out.coverage(errors, z) for z in zs}
        for k, s in enumerate(held_out.fractions):
            table[f"{s:g}"] = {f"{z:g}σ": per_z[z][k] for z in zs}
        out[label] = table
    return out


def stated_coverage(
    predictor: Any, curves: Sequence[Curve], fractions: Sequence[float] = (0.1, 0.2, 0.3),
    zs: Sequence[float] = (1.0, 2.0),
) -> dict[str, dict[str, float]]:
    """Coverage of the intervals ``predictor`` itself states, on curves it was not fitted on.

    For each stop fraction s: every curve is cut at its first point at or past s (as a rung
    is), ``predict_final`` gives L̂(T) ± σ (σ with the e(s) that applies to that run:
    ``Predictor.relative_error``), and the entry holds the number of predictions ``n``, the
    RMS relative error ``rms``, and for each z the fraction of true finals inside ±z·σ.
    """
    out: dict[str, dict[str, float]] = {}
    for s in fractions:
        errors, inside = [], {z: [] for z in zs}
        for curve in curves:
            pred = predict_at(predictor, curve, s)
            if pred is None:
                continue
            gap = pred.final_loss - curve.final_loss
            errors.append(gap / curve.final_loss)
            for z in zs:
                inside[z].append(abs(gap) <= z * pred.uncertainty)
        row: dict[str, float] = {"n": float(len(errors)),
                                 "rms": float(np.sqrt(np.mean(np.square(errors)))) if errors else float("nan")}
        for z in zs:
            row[f"{z:g}σ"] = float(np.mean(inside[z])) if inside[z] else float("nan")
        out[f"{s:g}"] = row
    return out


def coverage_markdown(rows: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """A markdown table of :func:`stated_coverage` results, one row per (label, s)."""
    from hpo.tables import markdown_table

    def pct(v: float, digits: int = 0) -> str:
        return "n/a" if not np.isfinite(v) else f"{100 * v:.{digits}f}%"

    body = [[label, s, int(row["n"]), pct(row["rms"], 2), pct(row.get("1σ", np.nan)), pct(row.get("2σ", np.nan))]
            for label, by_s in rows.items() for s, row in by_s.items()]
    return markdown_table(["curves", "s", "n", "RMS error", "±1σ", "±2σ"], body, pad=False)


def coverage_as_stated_and_in_scale(
    predictor: Any, curves: Sequence[Curve], fractions: Sequence[float] = (0.1, 0.2, 0.3)
) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`stated_coverage` as the predictor states it (its cross-scale error for runs off
    its scale) and, where it has a cross-scale error, with its in-scale error only — what a
    predictor calibrated at one scale alone would state."""
    out = {"as stated": stated_coverage(predictor, curves, fractions)}
    table = predictor.decision_error
    if table is not None and table.cross_scale is not None:
        in_scale = dataclasses.replace(predictor, decision_error=dataclasses.replace(
            table, cross_scale=None, cross_scale_source=None, groups=()))
        out["in-scale e(s) only"] = stated_coverage(in_scale, curves, fractions)
    return out


# ---------------------------------------------------------------------- ranking error

#: Most refits a ranking-error measurement makes: sweeps are held out together, in this many
#: folds at most (every sweep its own fold when there are fewer).
RANKING_FOLDS = 10


def sweep_items(curves: Sequence[Curve]) -> dict[str, dict[str, Any]]:
    """Curve name → its sweep values (``hpo.rules.sweep_values`` of meta and controls) plus
    seeds: what :func:`hpo.rules.kind_groups` groups curves into sweeps by."""
    from hpo import rules

    out = {}
    for i, c in enumerate(curves):
        source = {**{k: v for k, v in c.meta.items() if v is not None}, **c.controls.to_dict()}
        values = rules.sweep_values(source)
        values["seed"], values["data_seed"] = c.meta.get("seed"), c.meta.get("data_seed")
        out[str(c.meta.get("name", i))] = values
    return out


def ranking_groups(curves: Sequence[Curve]) -> dict[str, list[list[int]]]:
    """Kind of sweep → its sweeps in the bank, as lists of curve indices (``hpo.rules``)."""
    from hpo import rules
    from predictors.ranking import SWEEP_KINDS

    items = sweep_items(curves)
    index = {name: i for i, name in enumerate(items)}
    out = {}
    for kind in SWEEP_KINDS:
        groups = [[index[n] for n in g] for g in rules.kind_groups(items, kind)]
        if groups:
            out[kind] = groups
    return out


def probit_scale(d_pred: np.ndarray, d_true: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(maximum-likelihood, upper-bound) ranking scale σ of pairs: P(the true log-ratio has the
    sign of the predicted one) = Φ(|d_pred|/σ). ``weights`` are the pairs' composite-likelihood
    weights; the upper bound is where the weighted log-likelihood falls 0.5 below its maximum
    (capped at 1, i.e. no ranking evidence at all). Pairs with no predicted order are left out."""
    from scipy.stats import norm

    keep = d_pred != 0
    g, w = np.abs(d_pred[keep]), weights[keep]
    agree = np.where(np.sign(d_pred[keep]) == np.sign(d_true[keep]), 1.0, -1.0)
    if not g.size:
        return 1.0, 1.0
    grid = np.geomspace(1e-4, 1.0, 481)
    loglik = np.array([float(np.sum(w * norm.logcdf(agree * g / s))) for s in grid])
    i = int(np.argmax(loglik))
    below = np.flatnonzero(loglik[i:] < loglik[i] - 0.5)
    return float(grid[i]), float(grid[i + below[0]]) if below.size else 1.0


def rung_losses(curves: Sequence[Curve], fractions: Sequence[float]) -> np.ndarray:
    """[fraction, curve] → the loss at the rung point (``rung_cut``: the scheduler's cut), what
    current-best ranks by; NaN where the curve never reaches the rung."""
    out = np.full((len(fractions), len(curves)), np.nan)
    for i, c in enumerate(curves):
        for k, s in enumerate(fractions):
            n = rung_cut(c.t_hat, s)
            if n is not None:
                out[k, i] = float(c.loss[n - 1])
    return out


def _pair_errors(
    predicted: Callable[[int, int], float], truth: np.ndarray, groups: Sequence[Sequence[int]], k: int,
    losses: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
    """(predicted log-ratios, true log-ratios, weights, groups used, log-ratios of the losses at
    the rung) of every pair within the groups at stop-fraction index ``k``; ``predicted(k, i)``
    is curve i's held-out prediction. Only trials with a prediction (and a rung loss, when
    ``losses`` is given) take part, as at a rung."""
    dp, dt, w, dl = [], [], [], []
    used = 0
    for g in groups:
        members = [i for i in g if np.isfinite(predicted(k, i)) and (losses is None or np.isfinite(losses[k, i]))]
        if len(members) < 2:
            continue
        used += 1
        weight = 2.0 / len(members)  # k(k−1)/2 pairs hold k − 1 independent differences
        for a_pos, a in enumerate(members):
            for b in members[a_pos + 1:]:
                dp.append(math.log(predicted(k, a) / predicted(k, b)))
                dt.append(math.log(truth[a] / truth[b]))
                dl.append(0.0 if losses is None else math.log(losses[k, a] / losses[k, b]))
                w.append(weight)
    return np.array(dp), np.array(dt), np.array(w), used, np.array(dl)


def agreement(d_order: np.ndarray, d_true: np.ndarray, weights: np.ndarray) -> float:
    """The weighted share of pairs an order gets right (a tie counts half)."""
    right = np.where(d_order == 0, 0.5, (np.sign(d_order) == np.sign(d_true)).astype(float))
    return float(np.sum(weights * right) / np.sum(weights))


def choose_order(d_pred: np.ndarray, d_loss: np.ndarray, d_true: np.ndarray, weights: np.ndarray
                 ) -> tuple[float, float, float, float]:
    """(weight, its pair share, predicted finals' share, losses' share): the largest blend
    weight w of ``predictors.ranking.ORDER_WEIGHTS`` whose score w·log P + (1 − w)·log L orders
    at least as many pairs right as the losses at the rung alone. The predictor is used as far
    as it is not worse than current-best's order on the calibration sweeps, and only so far
    (issue 25): by construction never worse there; w = 0 is the losses themselves."""
    from predictors.ranking import ORDER_WEIGHTS

    losses = agreement(d_loss, d_true, weights)
    for w in ORDER_WEIGHTS:
        share = agreement(w * d_pred + (1.0 - w) * d_loss, d_true, weights)
        if share >= losses - 1e-12:
            return w, share, agreement(d_pred, d_true, weights), losses
    return 0.0, losses, agreement(d_pred, d_true, weights), losses


def _fold_prediction(predicted: np.ndarray, fold_of: Mapping[tuple[int, ...], int],
                     groups: Sequence[Sequence[int]]) -> Callable[[int, int], float]:
    """Curve i's prediction at fraction index k from the refit that held out its sweep (a
    curve is in one sweep per kind, so one fold applies)."""
    fold = {i: fold_of[tuple(g)] for g in groups for i in g}
    return lambda k, i: float(predicted[fold[i], k, i])


def _kind_error(predicted: Callable[[int, int], float], truth: np.ndarray, groups: Sequence[Sequence[int]],
                fractions: Sequence[float], losses: Optional[np.ndarray] = None) -> Optional[Any]:
    """The ``KindError`` of these sweeps: the predicted finals' order (probit scale, RMS) and,
    with ``losses`` (:func:`rung_losses`), the losses' order and the blend :func:`choose_order`
    picks, with its scale."""
    from predictors.ranking import KindError

    rows = []
    for k, s in enumerate(fractions):
        dp, dt, w, used, dl = _pair_errors(predicted, truth, groups, k, losses)
        if not dp.size:
            continue
        mle, upper = probit_scale(dp, dt, w)
        row = [s, upper, float(np.sqrt(np.mean((dp - dt) ** 2))), int(dp.size), used, mle]
        if losses is not None:
            weight, share, pred_share, loss_share = choose_order(dp, dl, dt, w)
            loss_scale = probit_scale(dl, dt, w)[1]
            order_scale = probit_scale(weight * dp + (1.0 - weight) * dl, dt, w)[1]
            row += [pred_share, loss_share, loss_scale, weight, share, order_scale]
        rows.append(row)
    if not rows:
        return None
    columns = list(zip(*rows))
    s, upper, rms, n_pairs, n_groups, mle = columns[:6]
    if losses is None:
        return KindError(s, upper, rms, n_pairs, n_groups, mle)
    pred_share, loss_share, loss_scale, weight, share, order_scale = columns[6:]
    return KindError(s, upper, rms, n_pairs, n_groups, mle, agreement=pred_share, loss_agreement=loss_share,
                     loss_scale=loss_scale, weight=weight, order_agreement=share, order_scale=order_scale)


def ranking_error_table(
    curves: Sequence[Curve], *, fit_kwargs: Optional[Mapping[str, Any]] = None,
    fractions: Sequence[float] = DECISION_FRACTIONS,
    cross: Sequence[HeldOutPredictions] = (), progress: Optional[Callable[[str], None]] = None,
    method: Optional[Method] = None, refits: Optional[Refits] = None,
) -> Optional[Any]:
    """The ``RankingError`` a predictor ships (``predictors.ranking``), or None when the bank
    holds no sweep of any kind.

    In-scale: the bank's sweeps (:func:`ranking_groups`) are held out together
    (leave-one-sweep-out, in at most :data:`RANKING_FOLDS` folds): a refit without a fold's
    curves predicts them at every stop fraction, and each pair of one sweep is scored from
    the refit that saw neither. Across scales: the pairs of the same sweeps scored on each
    ``cross`` grouping's predictions (a whole TPP or model size held out at once); the larger
    per kind is kept. Only the TPP and size groupings count across scales: τ varies inside
    sweeps, which the kinds of sweep already measure.
    """
    from predictors.ranking import RankingError

    curves = list(curves)
    cross = [h for h in cross if h.scheme in _AXIS]
    method = _method(fit_kwargs, method, "ranking error")
    refits = refits if refits is not None else Refits(curves)
    fractions = tuple(float(s) for s in fractions)
    by_kind = ranking_groups(curves)
    if not by_kind:
        return None
    distinct = sorted({tuple(g) for groups in by_kind.values() for g in groups})
    n_folds = min(len(distinct), RANKING_FOLDS)
    fold_of = {g: j % n_folds for j, g in enumerate(distinct)}
    truth = np.array([c.final_loss for c in curves], dtype=np.float64)
    losses = rung_losses(curves, fractions)
    predicted = np.full((n_folds, len(fractions), len(curves)), np.nan)
    for j in range(n_folds):
        members = sorted({i for g, f in fold_of.items() if f == j for i in g})
        rest = [i for i in range(len(curves)) if i not in set(members)]
        if len(rest) < 2:
            continue
        refit = refits.predictor(rest, method)
        for i in members:
            for k, s in enumerate(fractions):
                predicted[j, k, i] = prediction_at(refit, curves[i], s)[0]
        if progress is not None:
            progress(f"ranking error: {j + 1}/{n_folds} leave-sweeps-out refits")
    kinds, crosses = {}, {}
    cross_groups = _cross_groups(curves, by_kind, truth, fractions, cross, losses)
    for kind, groups in by_kind.items():
        table = _kind_error(_fold_prediction(predicted, fold_of, groups), truth, groups, fractions, losses)
        if table is not None:
            kinds[kind] = table
        for held in cross:
            index = {s: k for k, s in enumerate(held.fractions)}
            if not all(s in index for s in fractions):
                continue
            x = _kind_error(lambda k, i: float(held.predicted[index[fractions[k]], i]), truth, groups, fractions, losses)
            if x is not None and (kind not in crosses or np.mean(x.scale) > np.mean(crosses[kind].scale)):
                crosses[kind] = x
    if not kinds:
        return None
    sources = ", ".join(f"{h.scheme} ({h.n_groups} groups)" for h in cross) or None
    return RankingError(kinds, crosses or None, f"leave-one-sweep-out ({n_folds} folds)", sources, cross_groups)


#: The axis of each cross-scale grouping (``predictors.ranking.Position.axis``).
_AXIS = {"leave-one-TPP-out": "tokens_per_param", "leave-one-size-out": "n_params"}


def _cross_groups(curves: Sequence[Curve], by_kind: Mapping[str, Sequence[Sequence[int]]], truth: np.ndarray,
                  fractions: Sequence[float], cross: Sequence[HeldOutPredictions],
                  losses: Optional[np.ndarray] = None) -> tuple[Any, ...]:
    """Per held-out TPP (size): the ranking error of the sweeps inside it, and where it lay
    against the values that remained (``predictors.ranking.HeldOutGroup``)."""
    from predictors.ranking import HeldOutGroup, Position

    out = []
    for held in cross:
        axis = _AXIS.get(held.scheme)
        index = {s: k for k, s in enumerate(held.fractions)}
        if axis is None or not all(s in index for s in fractions):
            continue
        groups = groups_of(curves, SCALE_GROUPINGS[held.scheme])
        values = [float(SCALE_GROUPINGS[held.scheme](curves[g[0]])) for g in groups]
        for gi, members in enumerate(groups):
            position = Position.of(values[gi], values[:gi] + values[gi + 1:], axis)
            if position is None:
                continue
            inside = set(members)
            kinds = {}
            for kind, sweeps in by_kind.items():
                mine = [g for g in sweeps if set(g) <= inside]
                x = _kind_error(lambda k, i: float(held.predicted[index[fractions[k]], i]), truth, mine, fractions,
                                losses)
                if x is not None:
                    kinds[kind] = x
            if kinds:
                out.append(HeldOutGroup(values[gi], position, kinds))
    return tuple(out)


def seed_noise(curves: Sequence[Curve]) -> Optional[tuple[float, str]]:
    """(σ_seed, source): the pooled seed-to-seed standard deviation of log final loss (≈ the
    relative spread of a final) over the configs run with several seeds; None when the bank
    holds no such config. What ``scheduler.tolerance`` defaults to: two finals closer than
    this are the same result."""
    items = sweep_items(curves)
    by_config: dict[tuple[Any, ...], list[float]] = {}
    for c, (name, values) in zip(curves, items.items()):
        key = tuple(None if values.get(k) is None else (round(math.log(values[k]), 2) if isinstance(values[k], float)
                                                      and values[k] > 0 else values[k])
                    for k in ("eta", "batch_size", "weight_decay", "tau", "tokens_per_param", "n_params", "schedule"))
        by_config.setdefault(key, []).append(math.log(c.final_loss))
    groups = [np.asarray(v) for v in by_config.values() if len(v) >= 2]
    dof = sum(g.size - 1 for g in groups)
    if dof == 0:
        return None
    pooled = math.sqrt(sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / dof)
    return pooled, f"pooled over {len(groups)} configs run with several seeds ({dof} degrees of freedom)"


def evaluation_groups(predictor: Predictor, curves: Sequence[Curve],
                      fractions: Sequence[float] = DECISION_FRACTIONS) -> tuple[Any, ...]:
    """The order error of sweeps the fit never saw, at scales the predictor was not calibrated
    at (``hpo calibrate``'s ``ranking_banks``: other model sizes, TPPs): per (N, TPP) of
    ``curves``, the ``HeldOutGroup`` of its sweeps predicted by ``predictor`` as it ships, placed
    on the model-size axis where N is off the calibrated sizes, else on the TPP axis (a group at
    a calibrated scale adds nothing and is left out)."""
    from predictors.ranking import HeldOutGroup

    curves = list(curves)
    fractions = tuple(float(s) for s in fractions)
    by_scale: dict[tuple[float, float], list[int]] = {}
    for i, c in enumerate(curves):
        by_scale.setdefault((float(curve_size(c) or 0.0), round(float(c.controls.tokens_per_param), 3)), []).append(i)
    out = []
    for (n_params, tpp), members in sorted(by_scale.items()):
        sub = [curves[i] for i in members]
        by_kind = ranking_groups(sub)
        positions = {p.axis: p for p in predictor.positions([controls_with_size(c) for c in sub])}
        position = positions.get("n_params") or positions.get("tokens_per_param")
        if not by_kind or position is None:
            continue
        truth = np.array([c.final_loss for c in sub], dtype=np.float64)
        losses = rung_losses(sub, fractions)
        predicted = np.array([[prediction_at(predictor, c, s)[0] for c in sub] for s in fractions])
        kinds = {}
        for kind, groups in by_kind.items():
            x = _kind_error(lambda k, i: float(predicted[k, i]), truth, groups, fractions, losses)
            if x is not None:
                kinds[kind] = x
        if kinds:
            value = n_params if position.axis == "n_params" else tpp
            out.append(HeldOutGroup(value, position, kinds))
    return tuple(out)
