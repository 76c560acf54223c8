"""Held-out errors of the predictor: leave-one-out and across scales, and interval coverage.

A calibration states how wrong a predicted final loss can be at a stop fraction s (e(s), the
``DecisionError`` a predictor carries). That statement is only worth what it was measured on:

* **leave-one-out** (refit without each curve, predict it): the error for a new run *at the
  calibrated scale* (the same model sizes, TPPs and τ as the bank); a curve that held out would
  lie beyond every other on an axis is an extrapolation and left to the cross-scale groups
  (:func:`beyond_the_rest`);
* **across scales, per held-out group** (issue 15): along each axis (TPP, model size N, τ) the
  bank holds two or more values of, refit without every curve of one value and predict those
  (leave-one-group-out: interior and end values), and refit on the values up to (down from)
  each one and predict every value beyond (extrapolation: distances as far as the bank
  allows). Every held-out group keeps its error and where it lay
  (``predictors.ranking.Position``); a run off the calibrated scale gets the error of the
  groups in the same situation at least as far away, grown with distance beyond them
  (``predictors.distance``). The pooled RMS of each leave-one-group-out grouping is kept as
  ``DecisionError.cross_scale`` for files and axes without groups.

**Size in the prediction** (issue 15) is chosen in :mod:`hpo.calibration.size_choice` from these
leave-one-size-out predictions, and the **ranking error** (how reliably sweeps are ordered) is
measured in :mod:`hpo.calibration.ranking_error` from the same refits (:class:`Refits`, shared).

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


def refit_method(fit_kwargs: Optional[Mapping[str, Any]], method: Optional[Method], scheme: str) -> Method:
    """``method``, or (without one) the refit of ``fit_kwargs`` named after ``scheme``."""
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
        seen: the values on the axis the refit was calibrated on (empty where not recorded).
    """

    scheme: str
    value: float
    position: Position
    members: tuple[int, ...]
    predicted: np.ndarray
    residual: np.ndarray
    truth: np.ndarray
    seen: tuple[float, ...] = ()

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
    method = refit_method(fit_kwargs, method, scheme)
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


def beyond_the_rest(curves: Sequence[Curve], i: int) -> bool:
    """Whether curve ``i`` lies beyond every other curve on an axis (its TPP, model size or τ
    above the largest or below the smallest of the rest, by more than ``GROUP_TOLERANCE``):
    held out alone, it is predicted by extrapolation, not at the calibrated scale."""
    for value in SCALE_GROUPINGS.values():
        v = value(curves[i])
        if v is None or not math.isfinite(v):
            continue
        rest = [x for j, c in enumerate(curves) if j != i
                for x in (value(c),) if x is not None and math.isfinite(x)]
        if rest and (v > max(rest) * (1 + GROUP_TOLERANCE) or v < min(rest) * (1 - GROUP_TOLERANCE)):
            return True
    return False


def leave_one_out(curves: Sequence[Curve], *, fit_kwargs: Optional[Mapping[str, Any]] = None,
                  fractions: Sequence[float] = DECISION_FRACTIONS, method: Optional[Method] = None,
                  refits: Optional[Refits] = None,
                  progress: Optional[Callable[[str], None]] = None) -> HeldOutPredictions:
    """Every curve held out once, except a curve that would then lie beyond the rest on an axis
    (:func:`beyond_the_rest`; its prediction stays NaN): this is the error at the calibrated
    scale, and a run at an end TPP, size or τ of its own is an extrapolation, measured as such
    across scales. In a ladder of one run per width the two end widths held out are
    extrapolations 1.5-2x away whose error (35% at s = 0.1 on the Perl ladder) set the in-scale
    error, and with it the floor of every band, ~10x above the error of the runs predicted
    (issue 37). Every curve is held out where all would be beyond the rest (two curves)."""
    inside = [i for i in range(len(curves)) if not beyond_the_rest(curves, i)]
    held = inside if inside else list(range(len(curves)))
    return held_out_predictions(curves, [[i] for i in held], "leave-one-out",
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
    method = refit_method(fit_kwargs, method, scheme)
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
                out.append(GroupPredictions(name, values[j], position, tuple(members), pr, rs, truth[members],
                                              tuple(seen)))
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
        int(np.isfinite(in_scale.predicted).any(axis=0).sum()), in_scale.scheme, tuple(bias[k] for k in keep), cross_rms, source, tuple(groups),
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
    from hpo.common.tables import markdown_table

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
