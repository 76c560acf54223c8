"""The ranking error a predictor ships: how reliably it orders the trials of one sweep.

Per kind of sweep (``predictors.ranking.SWEEP_KINDS``), the bank's sweeps are held out together
(leave-one-sweep-out, :func:`ranking_error_table`) and across scales (a whole TPP or model size
held out, from ``hpo.calibration.held_out``'s predictions); each pair of one sweep is scored by the probit
scale of its predicted log-ratio (:func:`probit_scale`), and the order the scheduler uses is the
blend of predicted finals and rung losses that is never worse than the losses alone on the
calibration sweeps (:func:`choose_order`, issue 25). Sweeps at scales the fit never saw (the
ranking banks) are scored with the predictor as it ships (:func:`evaluation_groups`); the
seed-to-seed noise of a final (:func:`seed_noise`) is the keep rule's default tolerance.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from hpo.calibration.held_out import SCALE_GROUPINGS, HeldOutPredictions, Method, Refits, groups_of, prediction_at, refit_method
from predictors import Curve
from predictors.curves import controls_with_size, curve_size, rung_cut
from predictors.kinds import SWEEP_KINDS, SWEEP_VALUE_KEYS, kind_groups, sweep_values
from predictors.predictor import DECISION_FRACTIONS, Predictor

#: Most refits a ranking-error measurement makes: sweeps are held out together, in this many
#: folds at most (every sweep its own fold when there are fewer).
RANKING_FOLDS = 10


def sweep_items(curves: Sequence[Curve]) -> dict[str, dict[str, Any]]:
    """Curve name → its sweep values (``predictors.kinds.sweep_values`` of meta and controls) plus
    seeds: what :func:`predictors.kinds.kind_groups` groups curves into sweeps by."""
    out = {}
    for i, c in enumerate(curves):
        source = {**{k: v for k, v in c.meta.items() if v is not None}, **c.controls.to_dict()}
        values = sweep_values(source)
        values["seed"], values["data_seed"] = c.meta.get("seed"), c.meta.get("data_seed")
        out[str(c.meta.get("name", i))] = values
    return out


def ranking_groups(curves: Sequence[Curve]) -> dict[str, list[list[int]]]:
    """Kind of sweep → its sweeps in the bank, as lists of curve indices (``predictors.kinds.kind_groups``)."""

    items = sweep_items(curves)
    index = {name: i for i, name in enumerate(items)}
    out = {}
    for kind in SWEEP_KINDS:
        groups = [[index[n] for n in g] for g in kind_groups(items, kind)]
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
    method = refit_method(fit_kwargs, method, "ranking error")
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
                    for k in SWEEP_VALUE_KEYS)
        by_config.setdefault(key, []).append(math.log(c.final_loss))
    groups = [np.asarray(v) for v in by_config.values() if len(v) >= 2]
    dof = sum(g.size - 1 for g in groups)
    if dof == 0:
        return None
    pooled = math.sqrt(sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / dof)
    return pooled, f"pooled over {len(groups)} configs run with several seeds ({dof} degrees of freedom)"


def swept_sizes(curves: Sequence[Curve]) -> tuple[float, ...]:
    """The model sizes at which ``curves`` hold a sweep of some kind (:func:`ranking_groups`):
    where the calibration saw trials ranked, as opposed to every size it saw a curve at."""
    sizes = {float(curve_size(curves[i]) or 0.0) for groups in ranking_groups(curves).values()
             for g in groups for i in g}
    return tuple(sorted(n for n in sizes if n > 0))


def evaluation_groups(predictor: Predictor, curves: Sequence[Curve],
                      fractions: Sequence[float] = DECISION_FRACTIONS,
                      swept: Optional[Sequence[float]] = None) -> tuple[Any, ...]:
    """The order error of sweeps the fit never saw, at scales the predictor was not calibrated
    at (``hpo calibrate``'s ``ranking_banks``: other model sizes, TPPs): per (N, TPP) of
    ``curves``, the ``HeldOutGroup`` of its sweeps predicted by ``predictor`` as it ships, placed
    on the model-size axis where N is off the sizes the calibration held sweeps at (``swept``,
    :func:`swept_sizes` of its bank; None: the predictor's calibrated sizes), else on the TPP
    axis (a group at a calibrated scale adds nothing and is left out).

    Why the swept sizes and not every calibrated size: docs/predictor.md ("The keep margin's
    off-scale rule")."""
    from predictors.ranking import HeldOutGroup, Position

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
        if swept is not None:
            positions.pop("n_params", None)
            off_size = Position.of(n_params, swept, "n_params")
            if off_size is not None:
                positions["n_params"] = off_size
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


def corpus_order_error(predictor: Predictor, curves: Sequence[Curve], corpora: Sequence[str],
                       fractions: Sequence[float] = DECISION_FRACTIONS) -> Optional[Any]:
    """The order error where users are: on corpora the predictor was not fitted on. Every sweep
    of ``curves`` (banks of other corpora, ``corpus_banks``; complete runs) is predicted by
    ``predictor`` as it ships, and each kind's pairs are scored as in :func:`ranking_error_table`
    (probit scale, the blend :func:`choose_order` picks on these sweeps). Returns the
    ``RankingError`` whose ``kinds`` the rule reads (None: no sweep), its source naming the corpora."""
    from predictors.ranking import RankingError

    curves = list(curves)
    by_kind = ranking_groups(curves)
    if not by_kind:
        return None
    fractions = tuple(float(s) for s in fractions)
    truth = np.array([c.final_loss for c in curves], dtype=np.float64)
    predicted = np.array([[prediction_at(predictor, c, s)[0] for c in curves] for s in fractions])
    losses = rung_losses(curves, fractions)
    kinds = {kind: x for kind, groups in by_kind.items()
             if (x := _kind_error(lambda k, i: float(predicted[k, i]), truth, groups, fractions, losses)) is not None}
    n = sum(len(g) for g in by_kind.values())
    return RankingError(kinds, source=f"measured on {n} sweeps of other corpora than the fit's ({', '.join(corpora)})")
