"""Held-out errors of the predictor: leave-one-out and across scales, and interval coverage.

A calibration states how wrong a predicted final loss can be at a stop fraction s (e(s), the
``DecisionError`` a predictor carries). That statement is only worth what it was measured on:

* **leave-one-out** (refit without each curve, predict it): the error for a new run *at the
  calibrated scale* (the same model sizes and TPPs as the bank);
* **leave-one-group-out across scales**: refit without every curve of one TPP (one model size),
  predict those: the error for a run at a TPP (size) the bank does not hold. The larger of the
  groupings is stored as ``DecisionError.cross_scale`` and used for runs away from the
  calibrated scale (``Predictor.relative_error``).

**Coverage** is the check of a stated interval: the fraction of held-out true finals inside
prediction ± z·σ, with σ = L̂(T)·sqrt(residual² + e(s)²) as ``Predictor.predict_final`` states it
(``z = 2`` should cover ~95% if the errors were Gaussian with the stated σ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from predictors import Curve, fit
from predictors.curves import rung_cut
from predictors.predictor import DECISION_FRACTIONS, DecisionError

# Two TPPs (model sizes) within this relative distance are one group.
GROUP_TOLERANCE = 0.01
# Groupings across scales: the name used in tables, and the curve value that defines a group.
SCALE_GROUPINGS: dict[str, Callable[[Curve], Optional[float]]] = {
    "leave-one-TPP-out": lambda c: float(c.controls.tokens_per_param),
    "leave-one-size-out": lambda c: (float(c.meta["n_params"]) if c.meta.get("n_params") is not None
                                     else (float(c.controls.n_params) if c.controls.n_params else None)),
}


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
    """

    scheme: str
    fractions: tuple[float, ...]
    predicted: np.ndarray
    residual: np.ndarray
    truth: np.ndarray
    n_groups: int

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
    refuses the run, e.g. losses below its irreducible loss)."""
    n = rung_cut(curve.t_hat, stop_fraction)
    if n is None or n < predictor.align.min_points:
        return None
    try:
        return predictor.predict_final(curve.t_hat[:n], curve.loss[:n], curve.controls)
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
    fit_kwargs: Mapping[str, Any],
    fractions: Sequence[float] = DECISION_FRACTIONS,
    progress: Optional[Callable[[str], None]] = None,
) -> HeldOutPredictions:
    """Refit without each group of curves (indices into ``curves``) and predict the group.

    A group whose complement holds fewer than 2 curves is skipped (its predictions stay NaN).
    ``fit_kwargs`` go to :func:`predictors.fit` (``t_min``, ``fit_m``, ``fit_irreducible``).
    """
    curves = list(curves)
    fractions = tuple(float(s) for s in fractions)
    predicted = np.full((len(fractions), len(curves)), np.nan)
    residual = np.full_like(predicted, np.nan)
    for g, members in enumerate(groups):
        held = set(members)
        rest = [c for j, c in enumerate(curves) if j not in held]
        if len(rest) < 2:
            continue
        predictor = fit(rest, decision_fractions=(), **dict(fit_kwargs)).predictor
        for i in members:
            for k, s in enumerate(fractions):
                predicted[k, i], residual[k, i] = prediction_at(predictor, curves[i], s)
        if progress is not None:
            progress(f"{scheme}: {g + 1}/{len(groups)} refits")
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


def leave_one_out(curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any],
                  fractions: Sequence[float] = DECISION_FRACTIONS) -> HeldOutPredictions:
    """Every curve held out once."""
    return held_out_predictions(curves, [[i] for i in range(len(curves))], "leave-one-out",
                                fit_kwargs=fit_kwargs, fractions=fractions)


def across_scales(curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any],
                  fractions: Sequence[float] = DECISION_FRACTIONS) -> list[HeldOutPredictions]:
    """One :class:`HeldOutPredictions` per grouping in ``SCALE_GROUPINGS`` that has at least
    two groups in the bank (a bank of one model size gives no leave-one-size-out)."""
    out = []
    for scheme, value in SCALE_GROUPINGS.items():
        groups = groups_of(curves, value)
        if len(groups) >= 2:
            out.append(held_out_predictions(curves, groups, scheme, fit_kwargs=fit_kwargs, fractions=fractions))
    return out


def decision_error_table(in_scale: HeldOutPredictions, cross: Sequence[HeldOutPredictions] = ()) -> DecisionError:
    """The ``DecisionError`` a predictor ships: RMS of ``in_scale`` per stop fraction, and as
    ``cross_scale`` the larger RMS of the cross-scale groupings (where any was measured)."""
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
    return DecisionError(
        tuple(in_scale.fractions[k] for k in keep), tuple(rms[k] for k in keep), "rms",
        len(in_scale.truth), in_scale.scheme, tuple(bias[k] for k in keep), cross_rms, source,
    )


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
    import dataclasses

    out = {"as stated": stated_coverage(predictor, curves, fractions)}
    table = predictor.decision_error
    if table is not None and table.cross_scale is not None:
        in_scale = dataclasses.replace(predictor, decision_error=dataclasses.replace(
            table, cross_scale=None, cross_scale_source=None))
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


def _pair_errors(
    predicted: Callable[[int, int], float], truth: np.ndarray, groups: Sequence[Sequence[int]], k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(predicted log-ratios, true log-ratios, weights, groups used) of every pair within the
    groups at stop-fraction index ``k``; ``predicted(k, i)`` is curve i's held-out prediction."""
    dp, dt, w = [], [], []
    used = 0
    for g in groups:
        members = [i for i in g if np.isfinite(predicted(k, i))]
        if len(members) < 2:
            continue
        used += 1
        weight = 2.0 / len(members)  # k(k−1)/2 pairs hold k − 1 independent differences
        for a_pos, a in enumerate(members):
            for b in members[a_pos + 1:]:
                dp.append(math.log(predicted(k, a) / predicted(k, b)))
                dt.append(math.log(truth[a] / truth[b]))
                w.append(weight)
    return np.array(dp), np.array(dt), np.array(w), used


def _fold_prediction(predicted: np.ndarray, fold_of: Mapping[tuple[int, ...], int],
                     groups: Sequence[Sequence[int]]) -> Callable[[int, int], float]:
    """Curve i's prediction at fraction index k from the refit that held out its sweep (a
    curve is in one sweep per kind, so one fold applies)."""
    fold = {i: fold_of[tuple(g)] for g in groups for i in g}
    return lambda k, i: float(predicted[fold[i], k, i])


def _kind_error(predicted: Callable[[int, int], float], truth: np.ndarray, groups: Sequence[Sequence[int]],
                fractions: Sequence[float]) -> Optional[Any]:
    from predictors.ranking import KindError

    rows = []
    for k, s in enumerate(fractions):
        dp, dt, w, used = _pair_errors(predicted, truth, groups, k)
        if dp.size:
            mle, upper = probit_scale(dp, dt, w)
            rows.append((s, upper, float(np.sqrt(np.mean((dp - dt) ** 2))), int(dp.size), used, mle))
    if not rows:
        return None
    s, upper, rms, n_pairs, n_groups, mle = zip(*rows)
    return KindError(s, upper, rms, n_pairs, n_groups, mle)


def ranking_error_table(
    curves: Sequence[Curve], *, fit_kwargs: Mapping[str, Any], fractions: Sequence[float] = DECISION_FRACTIONS,
    cross: Sequence[HeldOutPredictions] = (), progress: Optional[Callable[[str], None]] = None,
) -> Optional[Any]:
    """The ``RankingError`` a predictor ships (``predictors.ranking``), or None when the bank
    holds no sweep of any kind.

    In-scale: the bank's sweeps (:func:`ranking_groups`) are held out together
    (leave-one-sweep-out, in at most :data:`RANKING_FOLDS` folds): a refit without a fold's
    curves predicts them at every stop fraction, and each pair of one sweep is scored from
    the refit that saw neither. Across scales: the pairs of the same sweeps scored on each
    ``cross`` grouping's predictions (a whole TPP or model size held out at once); the larger
    per kind is kept.
    """
    from predictors.ranking import RankingError

    curves = list(curves)
    fractions = tuple(float(s) for s in fractions)
    by_kind = ranking_groups(curves)
    if not by_kind:
        return None
    distinct = sorted({tuple(g) for groups in by_kind.values() for g in groups})
    n_folds = min(len(distinct), RANKING_FOLDS)
    fold_of = {g: j % n_folds for j, g in enumerate(distinct)}
    truth = np.array([c.final_loss for c in curves], dtype=np.float64)
    predicted = np.full((n_folds, len(fractions), len(curves)), np.nan)
    for j in range(n_folds):
        members = sorted({i for g, f in fold_of.items() if f == j for i in g})
        rest = [c for i, c in enumerate(curves) if i not in set(members)]
        if len(rest) < 2:
            continue
        refit = fit(rest, decision_fractions=(), **dict(fit_kwargs)).predictor
        for i in members:
            for k, s in enumerate(fractions):
                predicted[j, k, i] = prediction_at(refit, curves[i], s)[0]
        if progress is not None:
            progress(f"ranking error: {j + 1}/{n_folds} leave-sweeps-out refits")
    kinds, crosses = {}, {}
    cross_groups = _cross_groups(curves, by_kind, truth, fractions, cross)
    for kind, groups in by_kind.items():
        table = _kind_error(_fold_prediction(predicted, fold_of, groups), truth, groups, fractions)
        if table is not None:
            kinds[kind] = table
        for held in cross:
            index = {s: k for k, s in enumerate(held.fractions)}
            if not all(s in index for s in fractions):
                continue
            x = _kind_error(lambda k, i: float(held.predicted[index[fractions[k]], i]), truth, groups, fractions)
            if x is not None and (kind not in crosses or np.mean(x.scale) > np.mean(crosses[kind].scale)):
                crosses[kind] = x
    if not kinds:
        return None
    sources = ", ".join(f"{h.scheme} ({h.n_groups} groups)" for h in cross) or None
    return RankingError(kinds, crosses or None, f"leave-one-sweep-out ({n_folds} folds)", sources, cross_groups)


#: The axis of each cross-scale grouping (``predictors.ranking.Position.axis``).
_AXIS = {"leave-one-TPP-out": "tokens_per_param", "leave-one-size-out": "n_params"}


def _cross_groups(curves: Sequence[Curve], by_kind: Mapping[str, Sequence[Sequence[int]]], truth: np.ndarray,
                  fractions: Sequence[float], cross: Sequence[HeldOutPredictions]) -> tuple[Any, ...]:
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
                x = _kind_error(lambda k, i: float(held.predicted[index[fractions[k]], i]), truth, mine, fractions)
                if x is not None:
                    kinds[kind] = x
            if kinds:
                out.append(HeldOutGroup(values[gi], position, kinds))
    return tuple(out)
