"""The decision rules, in one place: what the scheduler, the replay, the report, the
calibration and every benchmark apply (no Ray, no torch).

* **The cut** at a decision fraction s: ``predictors.curves.rung_cut`` (the points up to and
  including the first with t̂ ≥ s); :func:`predict_at_rung` applies it.
* **The prediction at a rung**: :func:`predict_at_rung` (never raises; a trial without a
  prediction is kept).
* **The kind of sweep** (what varies: η, B, λ, at fixed τ or fixed λ): :func:`sweep_kind`,
  and the groups of curves that form sweeps of a kind: :func:`kind_groups`.
* **The keep rule's mechanics**: :func:`keep_rule` (a whole rung: the top ⌈n/rf⌉ plus a
  margin); the calibrated order, margin and tolerance of a rung from the predictor's ranking
  error: :func:`rung_margin`. The rules themselves (collapse, ASHA, current-best, a paired
  test) are :mod:`hpo.decisions.keep`, one a module behind one seam.
* **The probability that the pick is the best**: :func:`probability_best`.
* **Compute accounting**: :func:`compute_fraction`.

The keep rule's mechanics (:func:`keep_rule`): rank the trials with a prediction by the rung's
score (:func:`score`: w·log P + (1 − w)·log L; ties by the loss at the rung, then trial id);
keep the best ⌈n/rf⌉ at an intermediate rung and the best one at the last, plus every trial
within the margin less the tolerance of the best. Which margin, and why: ``hpo.decisions.keep``.
Trials without a prediction are always kept and do not count towards ⌈n/rf⌉.

Example:
    >>> d = keep_rule([Candidate("a", 2.00, 2.3), Candidate("b", 2.03, 2.2), Candidate("c", 2.20, 2.4)],
    ...               last=True, reduction_factor=2, margin=0.01)
    >>> d.kept, d.stopped, d.predicted_best, d.current_best
    (('a',), ('b', 'c'), 'a', 'b')
    >>> keep_rule([Candidate("a", 2.00, 2.3), Candidate("b", 2.03, 2.2)], last=True,
    ...           reduction_factor=2, margin=0.02).kept_all
    True
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
from scipy import special

from predictors import run_keys
from predictors.controls import Controls
from predictors.curves import T_HAT_EPS, rung_cut
from predictors.io import finite_or_none
from predictors.kinds import KIND_GROUPS, KINDS, SWEEP_KINDS, kind_axes
from predictors.ranking import Order

#: Fewest history points (up to and including the rung point) a prediction needs by default.
DEFAULT_MIN_POINTS = 3
#: The default rungs and keep-margin (in units of the rung's σ): chosen leave-one-corpus-out by
#: ``benchmarks/decisions.py::select_default``, the cheapest collapse setting that picked within
#: σ_seed on ≥ 90% and kept the true best on ≥ 95% of the replicates of each development corpus
#: (stdlib, Perl, C headers); docs/decisions.md has the held-out figures, misses included.
DEFAULT_RUNGS = (0.3,)
DEFAULT_MARGIN_Z = 0.5
#: Two sweep values within this relative distance are the same value (τ = B/(η·λ·D) is
#: recomputed per run, and D is rounded to whole steps).
SAME_VALUE_TOLERANCE = 0.01
#: Keys of a trial's sweep values (:func:`sweep_values`).
logger = logging.getLogger("hpo.decisions.rules")
SWEEP_VALUE_KEYS = run_keys.names(sweep_value=True)  # the table: predictors.run_keys


# ---------------------------------------------------------------------- the prediction


@dataclass(frozen=True)
class RungPrediction:
    """What a trial gets at a rung: the prediction and the point it was made from.

    ``final_loss``/``uncertainty`` are None (and ``why`` says why) when there is no
    prediction; ``train_fraction``/``loss`` are the t̂ and smoothed loss of the rung point
    (None when the history never reaches the rung).
    """

    final_loss: Optional[float]
    uncertainty: Optional[float]
    n_points: int
    train_fraction: Optional[float]
    loss: Optional[float]
    why: str = ""
    residual: Optional[float] = None  # RMS relative residual of the alignment (the fit to the shape)


def predict_at_rung(
    predictor: Any,
    t_hat: Sequence[float],
    loss: Sequence[float],
    controls: Optional[Controls | Mapping[str, Any]],
    stop_fraction: float,
    min_points: int = DEFAULT_MIN_POINTS,
) -> RungPrediction:
    """The prediction a trial gets at rung ``stop_fraction`` from its (t̂, smoothed loss)
    history: the points of ``rung_cut`` handed to ``predictor.predict_final`` with the
    trial's controls. Never raises: no controls, too few points, a failing predictor or a
    non-finite result give a :class:`RungPrediction` without a prediction."""
    return predict_at_rungs(predictor, [(t_hat, loss)], [controls], stop_fraction, min_points)[0]


def predict_at_rungs(
    predictor: Any,
    histories: Sequence[tuple[Sequence[float], Sequence[float]]],
    controls: Sequence[Optional[Controls | Mapping[str, Any]]],
    stop_fraction: float,
    min_points: int = DEFAULT_MIN_POINTS,
    calibrated_error: bool = True,
) -> list[RungPrediction]:
    """:func:`predict_at_rung` for many trials at one rung, in one call of the predictor's
    batched ``predict_finals`` (a rung of 10,000 trials is one vectorised pass; a predictor
    without it is asked run by run). ``calibrated_error=False``: the caller reads only the
    predicted finals (``Predictor.predict_finals``)."""
    out: list[Optional[RungPrediction]] = [None] * len(histories)
    asked: list[tuple[int, np.ndarray, np.ndarray, Controls, float, float, int]] = []
    for i, ((t_hat, loss), ctrl) in enumerate(zip(histories, controls)):
        t = np.asarray(t_hat, dtype=np.float64)
        y = np.asarray(loss, dtype=np.float64)
        n = rung_cut(t, stop_fraction)
        if n is None:
            out[i] = RungPrediction(None, None, int(t.size), None, None,
                                    f"the history never reaches t̂ = {stop_fraction:g}")
            continue
        t_used, loss_used = float(t[n - 1]), float(y[n - 1])
        if ctrl is None:
            out[i] = RungPrediction(None, None, n, t_used, loss_used,
                                    "no controls (tau, tokens_per_param, schedule) in the results or config")
        elif n < min_points:
            out[i] = RungPrediction(None, None, n, t_used, loss_used, f"only {n} point(s) up to the rung, min_points={min_points}")
        else:
            try:
                asked.append((i, t[:n], y[:n], ctrl if isinstance(ctrl, Controls) else Controls.from_mapping(ctrl),
                              t_used, loss_used, n))
            except Exception as exc:  # noqa: BLE001 - bad controls keep the trial
                out[i] = RungPrediction(None, None, n, t_used, loss_used, f"predictor failed: {type(exc).__name__}: {exc}")
    for (i, _, _, _, t_used, loss_used, n), pred in zip(asked, _predict_all(predictor, asked, calibrated_error)):
        out[i] = _rung_prediction(pred, n, t_used, loss_used)
    return out  # type: ignore[return-value]


def _predict_all(predictor: Any, asked: Sequence[tuple], calibrated_error: bool) -> list[Any]:
    """The predictor's answer per asked run: a prediction or the exception it raised."""
    if not asked:
        return []
    batched = getattr(predictor, "predict_finals", None)
    if batched is not None:
        try:
            return list(batched([a[1] for a in asked], [a[2] for a in asked], [a[3] for a in asked],
                                calibrated_error=calibrated_error))
        except Exception as exc:  # noqa: BLE001 - a failing batch: each run asked alone below
            logger.warning("predict_finals failed (%s); predicting run by run", exc)
    answers: list[Any] = []
    for _, t, y, ctrl, *_ in asked:
        try:
            answers.append(predictor.predict_final(t, y, ctrl))
        except Exception as exc:  # noqa: BLE001 - a failed prediction keeps the trial
            answers.append(exc)
    return answers


def _rung_prediction(pred: Any, n: int, t_used: float, loss_used: float) -> RungPrediction:
    if isinstance(pred, Exception):
        return RungPrediction(None, None, n, t_used, loss_used, f"predictor failed: {type(pred).__name__}: {pred}")
    final = finite_or_none(getattr(pred, "final_loss", None))
    sigma = finite_or_none(getattr(pred, "uncertainty", None))
    residual = finite_or_none(getattr(pred, "residual", None))
    if final is None or final <= 0:
        return RungPrediction(None, None, n, t_used, loss_used, "predictor returned a non-finite final loss")
    return RungPrediction(final, None if sigma is None else abs(sigma), n, t_used, loss_used, residual=residual)


# ---------------------------------------------------------------------- kinds of sweep


def sweep_values(source: Mapping[str, Any]) -> dict[str, Any]:
    """The values that tell which kind of sweep a trial belongs to, from a result, a trial
    config or a bank row: η (``eta`` or ``lr``), B, λ, τ, TPP, N and the schedule (missing
    ones are None)."""
    def num(*keys: str) -> Optional[float]:
        for key in keys:
            value = finite_or_none(source.get(key))
            if value is not None:
                return value
        return None

    schedule = source.get("schedule")
    warmup = source.get("warmup_fraction")
    # Floor, WSD decay and cooldown shape only where they are not the defaults, so the value
    # of a schedule without them reads as it always did.
    floor, shape = source.get("final_fraction"), source.get("decay_shape")
    extra = "".join((f"/decay {source.get('decay_fraction')}" if schedule == "wsd" else "",
                     f"/floor {floor}" if floor not in (None, "", 0, 0.0) else "",
                     f"/{shape}" if shape not in (None, "", "linear") else ""))
    return {
        "eta": num("eta", "lr"),
        "batch_size": num("batch_size"),
        "weight_decay": num("weight_decay"),
        "tau": num("tau"),
        "tokens_per_param": num("tokens_per_param"),
        "n_params": num("n_params"),
        "schedule": None if schedule is None else f"{schedule}@{warmup}{extra}",
    }


def _varies(values: Sequence[Optional[Any]]) -> Optional[bool]:
    """Whether the values differ (beyond SAME_VALUE_TOLERANCE); None if any is unknown."""
    if any(v is None for v in values):
        return None
    if not values:
        return False
    if isinstance(values[0], str):
        return len(set(values)) > 1
    lo, hi = min(values), max(values)
    return hi > lo * (1.0 + SAME_VALUE_TOLERANCE) if lo > 0 else hi != lo


def sweep_kind(trials: Sequence[Mapping[str, Any]]) -> str:
    """The kind of sweep these trials form (their :func:`sweep_values`): one of
    ``predictors.kinds.SWEEP_KINDS``, or a broader group of ``KIND_GROUPS`` when the values
    do not pin one down (several of η, B, λ vary, or they are not reported).

    Example:
        >>> sweep_kind([{"eta": 0.01, "batch_size": 2048, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}])
        'eta_fixed_tau'
        >>> sweep_kind([{"eta": 0.01, "batch_size": 1024, "weight_decay": 0.1, "tau": 0.15},
        ...             {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.3}])
        'batch_fixed_lambda'
    """
    if len(trials) < 2:
        return "mixed"
    col = {k: [t.get(k) for t in trials] for k in SWEEP_VALUE_KEYS}
    if any(_varies(col[k]) for k in ("tokens_per_param", "n_params", "schedule")):
        return "mixed"
    varies = {k: _varies(col[k]) for k in ("tau", "eta", "batch_size", "weight_decay")}
    if varies["tau"] is None:
        return "mixed"
    for kind in KINDS:  # the table's kinds: the one value varied, everything it holds fixed
        if varies[kind.varies] and all(varies[h] is False for h in kind.holds):
            return kind.name
    return "fixed_tau" if varies["tau"] is False else "fixed_lambda" if varies["weight_decay"] is False else "varying_tau"


#: Values that every member of one sweep shares, whatever its kind.
_SHARED = ("tokens_per_param", "n_params", "schedule", "seed", "data_seed")


def _clusters(values: Sequence[Any]) -> list[Any]:
    """A label per value; numbers within SAME_VALUE_TOLERANCE share a label."""
    labels: list[Any] = []
    refs: list[float] = []
    for v in values:
        if v is None or isinstance(v, str):
            labels.append(v)
            continue
        for i, r in enumerate(refs):
            if abs(float(v) / r - 1.0) <= SAME_VALUE_TOLERANCE if r else v == r:
                labels.append(i)
                break
        else:
            refs.append(float(v))
            labels.append(len(refs) - 1)
    return labels


def kind_groups(items: Mapping[str, Mapping[str, Any]], kind: str) -> list[list[str]]:
    """The sweeps of ``kind`` among ``items`` (id → :func:`sweep_values` plus ``seed``,
    ``data_seed``): groups of ≥ 2 ids that share everything the kind holds fixed (and TPP, N,
    schedule and seeds) and differ in the value it varies. Each group is sorted; groups are
    sorted by their first id."""
    varied, fixed = kind_axes(kind)
    ids = sorted(items)
    keys = list(dict.fromkeys([*fixed, *_SHARED, varied]))
    # Seeds are names, not magnitudes: seeds 201 and 202 lie within SAME_VALUE_TOLERANCE of each
    # other, and clustering them pooled three replicates into one "sweep" (the order error
    # measured across seeds was inflated by the seed noise).
    labels = {k: [items[i].get(k) for i in ids] if k in ("seed", "data_seed") else
              _clusters([items[i].get(k) for i in ids]) for k in keys}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for n, i in enumerate(ids):
        if any(items[i].get(k) is None for k in (varied, *fixed)):
            continue
        groups.setdefault(tuple(labels[k][n] for k in keys if k != varied), []).append(i)
    out = []
    for members in groups.values():
        varied_labels = {labels[varied][ids.index(i)] for i in members}
        if len(varied_labels) >= 2:
            out.append(sorted(members))
    return sorted(out)


# ---------------------------------------------------------------------- margins


@dataclass(frozen=True)
class Margin:
    """The keep-margin of one rung: ``value`` in log units, from the ranking scale ``sigma`` of
    the order the rung ranks by (``weight``: 1 = the predicted finals, 0 = the losses at the
    rung, between: the blend w·log P + (1 − w)·log L; ``predictors.ranking.Order``) for the
    sweep's ``kind``; ``tolerance`` (log units, relative to the best's predicted final) is how
    close counts as the same result (``tolerance_loss`` when given in loss units);
    ``words`` says where each came from."""

    value: float
    sigma: float
    kind: str
    words: str
    weight: float = 1.0
    tolerance: float = 0.0
    tolerance_loss: Optional[float] = None
    order_words: str = ""  # where the order and its scale came from
    tolerance_words: str = ""
    fixed: bool = False  # a margin the user set, not the calibrated one

    @property
    def order(self) -> str:
        return Order(self.weight, None, "").name


def rung_margin(
    predictor: Any, stop_fraction: float, trials: Sequence[Mapping[str, Any]],
    controls: Sequence[Controls | Mapping[str, Any]] = (), *, margin: str | float = "calibrated",
    z: float = DEFAULT_MARGIN_Z, tolerance: Optional[float] = None,
) -> Margin:
    """The order and margin of a rung at ``stop_fraction`` for these trials (their
    :func:`sweep_values` and controls): the order the predictor's ranking error chose for the
    kind of sweep they form (``Predictor.ranking_order``: off the calibrated scale, the error
    of held-out sweeps as far, else the losses at the rung), and z·σ of that order; or the
    fixed log margin ``margin`` on the predicted finals when it is a number.

    ``tolerance`` (loss units; None: the seed noise the predictor measured) is how close two
    finals must be to count as the same: a trial is worth keeping past ⌈n/rf⌉ only if it could
    end better than the best by more than that (:func:`keep_rule`).
    """
    kind = sweep_kind(list(trials))
    ctrl = []
    for c in controls:
        try:
            ctrl.append(c if isinstance(c, Controls) else Controls.from_mapping(c or {}))
        except (KeyError, ValueError, TypeError):
            pass
    noise = finite_or_none(getattr(predictor, "seed_noise", None))
    if tolerance is not None:
        tol_log, tol_loss, tol_words = 0.0, float(tolerance), f"tolerance {float(tolerance):.4g} (loss units)"
    elif noise is not None:
        tol_log, tol_loss, tol_words = noise, None, f"tolerance = seed noise {100 * noise:.2f}%"
    else:
        tol_log, tol_loss, tol_words = 0.0, None, "no seed noise measured: tolerance 0"
    order_of = getattr(predictor, "ranking_order", None)
    scale_of = getattr(predictor, "ranking_scale", None)  # a predictor that states only a scale
    weight, sigma, words = 1.0, None, "the predictor states no ranking error"
    if callable(order_of):
        order = order_of(stop_fraction, kind, ctrl)
        weight, sigma, words = order.weight, order.scale, order.words
    elif callable(scale_of):
        sigma, words = scale_of(stop_fraction, kind, ctrl)
        sigma = float(sigma)
    if margin != "calibrated":
        return Margin(float(margin), sigma or 0.0, kind, f"fixed margin {100 * float(margin):.2f}% on the predicted finals",
                      1.0, tol_log, tol_loss, words, tol_words, fixed=True)
    name = Order(weight, None, "").name
    if not sigma:
        return Margin(0.0, 0.0, kind, f"order: {name}; {words}; its error unknown: margin 0, {tol_words}",
                      weight, tol_log, tol_loss, words, tol_words)
    return Margin(float(z) * sigma, sigma, kind, f"order: {name}; {z:g} × ranking scale {100 * sigma:.2f}% "
                  f"= {100 * float(z) * sigma:.2f}% ({words}), less the {tol_words}", weight, tol_log, tol_loss,
                  words, tol_words)


# ---------------------------------------------------------------------- the keep rule


@dataclass(frozen=True)
class Candidate:
    """A trial at a rung: its predicted final loss (None: no prediction) and its smoothed
    loss at the rung point (the tie-break, and what current-best ranks by)."""

    trial_id: str
    predicted: Optional[float]
    loss: Optional[float]
    uncertainty: Optional[float] = None


@dataclass(frozen=True)
class KeepDecision:
    """The outcome of :func:`keep_rule` at one rung.

    Attributes:
        kept: ids kept, ranked ones first in rank order, then those without a prediction.
        stopped: ids the rule stops, in rank order.
        ranked: ids with a prediction, in rank order.
        reasons: id → the decision in words.
        predicted_best: the best-ranked id (None when nobody has a prediction).
        current_best: the id with the lowest loss at the rung.
        n_rule: how many the rule keeps before the margin (⌈n/rf⌉, or 1 at the last rung).
        margin: the log margin applied.
        kept_all: True when every ranked trial lies within the margin of the best (no honest
            ranking exists at this rung: everyone is kept).
    """

    kept: tuple[str, ...]
    stopped: tuple[str, ...]
    ranked: tuple[str, ...]
    reasons: Mapping[str, str]
    predicted_best: Optional[str]
    current_best: Optional[str]
    n_rule: int
    margin: float
    kept_all: bool
    words: str = ""  # the margin's provenance, as the decision log keeps it


def score(c: Candidate, weight: float = 1.0) -> float:
    """The log-score a rung ranks by: w·log(predicted final) + (1 − w)·log(loss at the rung)
    (the predicted final alone when the loss is unknown); lower is better."""
    log_p = math.log(c.predicted) if c.predicted else math.inf
    if weight >= 1.0 or c.loss is None or not (math.isfinite(c.loss) and c.loss > 0):
        return log_p
    return weight * log_p + (1.0 - weight) * math.log(c.loss)


def _rank_key(c: Candidate, weight: float = 1.0) -> tuple[float, float, str]:
    return (score(c, weight), c.loss if c.loss is not None and math.isfinite(c.loss) else math.inf, c.trial_id)


def _fmt(c: Candidate) -> str:
    sigma = f"±{c.uncertainty:.4f}" if c.uncertainty is not None else ""
    return f"{c.predicted:.4f}{sigma}"


def current_best(candidates: Iterable[Candidate]) -> Optional[str]:
    """The id with the lowest loss at the rung (ties: trial id); None without losses."""
    known = [c for c in candidates if c.loss is not None and math.isfinite(c.loss)]
    return min(known, key=lambda c: (c.loss, c.trial_id)).trial_id if known else None


def keep_rule(
    candidates: Sequence[Candidate], *, last: bool, reduction_factor: float, margin: float,
    margin_words: str = "", weight: float = 1.0, tolerance: float = 0.0, tolerance_loss: Optional[float] = None,
) -> KeepDecision:
    """Apply the keep rule (module docstring) to every trial at one rung, ranking by
    :func:`score` with ``weight``. ``tolerance`` (log units) or ``tolerance_loss`` (loss units,
    relative to the best's predicted final) is how close counts as the same result: the margin
    shrinks by it (a trial kept past ⌈n/rf⌉ must be able to end better than the best by more),
    and when every ranked trial lies within it the rung keeps ⌈n/rf⌉, never everyone.

    Example:
        >>> cands = [Candidate("a", 2.000, 2.3), Candidate("b", 2.004, 2.3), Candidate("c", 2.006, 2.3),
        ...          Candidate("d", 2.008, 2.3)]
        >>> keep_rule(cands, last=False, reduction_factor=2, margin=0.02, tolerance=0.01).kept
        ('a', 'b')
    """
    if not reduction_factor > 1.0:
        raise ValueError(f"reduction_factor: must be > 1, got {reduction_factor!r}")
    if not (margin >= 0.0 and math.isfinite(margin)):
        raise ValueError(f"margin: must be a finite number >= 0, got {margin!r}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight: must lie in [0, 1], got {weight!r}")
    ranked = sorted((c for c in candidates if c.predicted is not None and c.predicted > 0),
                    key=lambda c: _rank_key(c, weight))
    ranked_ids = {c.trial_id for c in ranked}
    unranked = [c for c in candidates if c.trial_id not in ranked_ids]
    n = len(ranked)
    n_rule = 1 if last else math.ceil(n / reduction_factor)
    reasons: dict[str, str] = {}
    kept: list[str] = []
    stopped: list[str] = []
    words = f" ({margin_words})" if margin_words else ""
    best = ranked[0] if ranked else None
    if tolerance_loss is not None and best is not None:
        tolerance = max(float(tolerance_loss), 0.0) / float(best.predicted)  # type: ignore[arg-type]
    tolerance = max(float(tolerance), 0.0)
    spread = score(ranked[-1], weight) - score(best, weight) if n > 1 and best else 0.0
    # Keeping a trial past ⌈n/rf⌉ buys at most what it could still win over the best: the
    # margin less the tolerance. Everyone within the tolerance: no trial can matter, ⌈n/rf⌉.
    within_tolerance = n > 1 and spread <= tolerance + 1e-12
    margin = 0.0 if within_tolerance else max(float(margin) - tolerance, 0.0)
    # A margin of 0 keeps exactly the rule's survivors, even on an exact tie.
    kept_all = n > 1 and margin > 0 and spread <= margin + 1e-12
    by = "" if weight >= 1.0 else f" (ranked by {Order(weight, None, '').name})"
    for i, c in enumerate(ranked):
        gap = score(c, weight) - score(best, weight)  # type: ignore[arg-type]
        place = f"predicted {_fmt(c)}{by} is {i + 1} of {n}"
        if i < n_rule:
            kept.append(c.trial_id)
            reasons[c.trial_id] = (f"{place}: the predicted best" if i == 0 else
                                   f"{place}; keeping the top {n_rule}")
        elif margin > 0 and gap <= margin + 1e-12:
            kept.append(c.trial_id)
            reasons[c.trial_id] = f"{place}, {100 * gap:.2f}% above the best: within the margin {100 * margin:.2f}%{words}"
        else:
            stopped.append(c.trial_id)
            reasons[c.trial_id] = f"{place}, {100 * gap:.2f}% above the best: beyond the margin {100 * margin:.2f}%{words}"
    if within_tolerance:
        for c in ranked[n_rule:]:
            reasons[c.trial_id] += (f"; all {n} lie within the tolerance {100 * tolerance:.2f}% of the best "
                                    f"(the same result within seed noise): keeping the top {n_rule}")
    if kept_all:
        for c in ranked:
            reasons[c.trial_id] = (f"predicted {_fmt(c)}; the spread of all {n} predictions, {100 * spread:.2f}%, "
                                   f"is within the margin {100 * margin:.2f}%{words}: keeping everyone")
    for c in unranked:
        kept.append(c.trial_id)
        reasons[c.trial_id] = "no prediction: kept"
    return KeepDecision(tuple(kept), tuple(stopped), tuple(c.trial_id for c in ranked), reasons,
                        best.trial_id if best else None, current_best(candidates), n_rule, float(margin), kept_all,
                        margin_words)


# ---------------------------------------------------------------------- probability


def probability_best(log_means: Sequence[float], log_sigmas: Sequence[float]) -> list[float]:
    """P(trial i has the lowest true final) when trial i's log-final is N(μ_i, σ_i²),
    independent across trials (σ_i = ranking scale/√2, so that a pair's difference has the
    ranking scale): P_i = ∫ Π_{j≠i} P(X_j > x) dF_i(x), by quadrature on a grid of
    ``PROBABILITY_GRID`` bins spanning where the lowest value can fall (F_i's mass per bin
    times the others' survival at its middle: within 2e-5 of a 8,192-bin grid at 1,250 trials,
    where 20,000 draws were within ±0.4%). Deterministic, and linear in the trials (a
    draw-based estimate cost about a second at the last rung of a 10,000-trial sweep).

    Example:
        >>> [round(float(p), 2) for p in probability_best([0.0, 0.0], [0.01, 0.01])]
        [0.5, 0.5]
        >>> round(probability_best([0.0, 0.02], [0.01 / 2 ** 0.5] * 2)[0], 3)  # Φ(2)
        0.977
    """
    mu_all = np.asarray(log_means, dtype=np.float64)
    sd_all = np.maximum(np.asarray(log_sigmas, dtype=np.float64), 1e-9)
    if mu_all.size <= 1:
        return [1.0] * mu_all.size
    # A trial more than 10 of the largest σ above the best never is the lowest: leave it out.
    contenders = np.flatnonzero(mu_all - mu_all.min() <= 10.0 * sd_all.max())
    mu, sd = mu_all[contenders], sd_all[contenders]
    # The lowest value lies above min(μ − 8σ) and below min(μ + 8σ) but with odds ~1e-15.
    edges = np.linspace(float(np.min(mu - 8.0 * sd)), float(np.min(mu + 8.0 * sd)), PROBABILITY_GRID + 1)
    middles = 0.5 * (edges[1:] + edges[:-1])
    chunk = max(1, 2_000_000 // PROBABILITY_GRID)
    parts = [slice(i, i + chunk) for i in range(0, mu.size, chunk)]

    def log_survival(part: slice) -> np.ndarray:  # log P(X_j > middle), trials × bins
        return special.log_ndtr(-(middles[None, :] - mu[part, None]) / sd[part, None])

    everyone = sum(log_survival(part).sum(axis=0) for part in parts)  # Σ_j log P(X_j > x)
    p = np.empty(mu.size)
    for part in parts:
        mass = np.diff(special.ndtr((edges[None, :] - mu[part, None]) / sd[part, None]), axis=1)
        p[part] = np.sum(mass * np.exp(everyone[None, :] - log_survival(part)), axis=1)
    out = np.zeros(mu_all.size)
    out[contenders] = p / p.sum()
    return [float(v) for v in out]


#: Bins of the quadrature in :func:`probability_best`.
PROBABILITY_GRID = 512


# ---------------------------------------------------------------------- compute


def compute_fraction(
    reached: Mapping[str, float], weights: Optional[Mapping[str, Optional[float]]] = None,
    extra: Optional[Mapping[str, float]] = None,
) -> float:
    """The compute a sweep spent, as a fraction of training every trial to the end:
    Σ_i w_i·(t̂_i + r_i) / Σ_i w_i, with t̂_i the fraction trial i reached (clipped to
    [0, 1]), r_i the fraction it trained twice (``extra``: work redone after a restart
    without a checkpoint) and w_i = N_i·D_i (``weights``; equal weights unless every trial
    has a positive one: exact within a sweep of one model size and TPP).

    Example:
        >>> round(compute_fraction({"a": 1.0, "b": 0.1, "c": 0.1}), 6)
        0.4
    """
    if not reached:
        return 0.0
    ids = list(reached)
    w = [finite_or_none((weights or {}).get(i)) for i in ids]
    if any(v is None or v <= 0 for v in w):
        w = [1.0] * len(ids)
    done = sum(wi * (min(max(float(reached[i]), 0.0), 1.0) + max(float((extra or {}).get(i, 0.0)), 0.0))
               for i, wi in zip(ids, w))
    return float(done / sum(w))  # type: ignore[arg-type]


def is_finished(train_fraction: float) -> bool:
    """Whether a trial that reached ``train_fraction`` ran to the end."""
    from predictors.smoothing import FINISHED_T_HAT

    return float(train_fraction) >= FINISHED_T_HAT


__all__ = [
    "Candidate", "DEFAULT_MARGIN_Z", "DEFAULT_MIN_POINTS", "DEFAULT_RUNGS", "KIND_GROUPS", "KeepDecision", "RungPrediction",
    "SWEEP_KINDS", "T_HAT_EPS", "compute_fraction", "current_best", "is_finished",
    "keep_rule", "kind_groups", "Margin", "predict_at_rung", "predict_at_rungs", "probability_best", "rung_margin", "score", "sweep_kind",
    "sweep_values",
]
