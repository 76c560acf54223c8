"""The keep-rule seam: evidence goes in, a decision comes out.

:func:`gather` collects the facts of one rung into :class:`RungEvidence`, the same for every
rule: each trial's prediction and loss at the rung, where it stood at the previous look, how
well its curve fits the predicted shape, its history; the order the predictor's ranking error
measured for the sweep's kind (its blend weight and σ) and the tolerance, with their sources.
:class:`KeepRule` is the seam (Optuna's ``BasePruner`` is the model): one method,
``decide(evidence) -> KeepDecision``. The decision says what it used (the order, σ, margin, and
per trial the clause that kept or stopped it, as data); the records, the early answer and the
benchmarks read it, never the evidence. :func:`keep_rule` holds the ranking mechanics the
rules share (rank by a score, keep the top ``n_keep``, then everyone within a margin).

Example:
    >>> ev = RungEvidence(0.1, False, 2.0, tuple(TrialEvidence(Candidate(t, p, l)) for t, p, l in
    ...                   [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6)]))
    >>> [c.trial_id for c in ev.candidates]
    ['a', 'b', 'c']
    >>> d = keep_rule([Candidate("a", 2.00, 2.3), Candidate("b", 2.03, 2.2), Candidate("c", 2.20, 2.4)],
    ...               last=True, reduction_factor=2, margin=0.01)
    >>> d.kept, d.stopped, d.predicted_best, d.current_best, d.clauses["c"].clause
    (('a',), ('b', 'c'), 'a', 'b', 'beyond')
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from predictors.controls import Controls
from predictors.io import finite_or_none
from predictors.kinds import sweep_kind
from predictors.ranking import Order


@dataclass(frozen=True)
class Candidate:
    """A trial at a rung: its predicted final loss (None: no prediction) and its smoothed
    loss at the rung point (the tie-break, and what current-best ranks by)."""

    trial_id: str
    predicted: Optional[float]
    loss: Optional[float]
    uncertainty: Optional[float] = None


@dataclass(frozen=True)
class TrialEvidence:
    """One trial at a rung: its :class:`Candidate`, the same at the previous look
    (``previous``: the previous rung, or half this rung's t̂ at the first), the RMS relative
    residual of its alignment to the predicted shape, and its (t̂, loss) history up to the rung."""

    candidate: Candidate
    previous: Optional[Candidate] = None
    residual: Optional[float] = None
    history: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class RungEvidence:
    """Everything a rule may read at one rung. ``weight``/``scale``/``order_words``: the order
    measured for ``kind`` (``predictors.ranking.Order``; scale None: unknown); ``tolerance``
    (log units) or ``tolerance_loss`` (loss units): how close counts as the same result;
    ``fixed_margin``: a margin the user set in log units (None: calibrated)."""

    fraction: float
    last: bool
    reduction_factor: float
    trials: tuple[TrialEvidence, ...]
    kind: str = "mixed"
    weight: float = 1.0
    scale: Optional[float] = None
    order_words: str = ""
    tolerance: float = 0.0
    tolerance_loss: Optional[float] = None
    tolerance_words: str = ""
    fixed_margin: Optional[float] = None

    @property
    def candidates(self) -> list[Candidate]:
        return [t.candidate for t in self.trials]

    def movement(self) -> Optional[float]:
        """How far the trials' scores moved against each other since the previous look: √2 × the
        standard deviation over trials of Δ(score) (a shared shift does not change the order;
        √2 puts it on the ranking scale of a pair). None with fewer than 3 trials seen twice."""
        moves = [score(t.candidate, self.weight) - score(t.previous, self.weight) for t in self.trials
                 if t.previous is not None and t.candidate.predicted and t.previous.predicted]
        moves = [m for m in moves if math.isfinite(m)]
        return float(math.sqrt(2.0) * np.std(moves, ddof=1)) if len(moves) >= 3 else None

    def misfit(self) -> Optional[float]:
        """How badly the curves fit the predicted shape, on the ranking scale: √2 × the blend
        weight × the RMS over trials of each alignment's relative residual (the losses at the
        rung, weight 0, do not depend on the shape). None when no residual is known."""
        res = [t.residual for t in self.trials if t.residual is not None and math.isfinite(t.residual)]
        return float(math.sqrt(2.0) * self.weight * math.sqrt(np.mean(np.square(res)))) if res else None

    def with_trials(self, trials: Sequence[TrialEvidence]) -> "RungEvidence":
        return dataclasses.replace(self, trials=tuple(trials))


def gather(predictor: Any, fraction: float, trials: Sequence[TrialEvidence], sweep_values: Sequence[Mapping[str, Any]],
           controls: Sequence[Any] = (), *, last: bool, reduction_factor: float, margin: str | float = "calibrated",
           tolerance: Optional[float] = None) -> RungEvidence:
    """The evidence of a rung at ``fraction``: ``trials`` with the order the predictor's ranking
    error chose for the kind of sweep their ``sweep_values`` form (``Predictor.ranking_order``),
    its σ, and the tolerance (``tolerance`` in loss units; None: the seed noise the predictor
    measured); ``margin`` a number: the user's fixed log margin on the predicted finals."""
    kind = sweep_kind(list(sweep_values))
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
        order = order_of(fraction, kind, ctrl)
        weight, sigma, words = order.weight, order.scale, order.words
    elif callable(scale_of):
        sigma, words = scale_of(fraction, kind, ctrl)
        sigma = float(sigma)
    return RungEvidence(fraction, last, reduction_factor, tuple(trials), kind, weight, sigma or None, words,
                        tol_log, tol_loss, tol_words, None if margin == "calibrated" else float(margin))


# ---------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Clause:
    """Why one trial was kept or stopped, as data (:func:`clause_words` says it in words).
    ``clause``: ``best``, ``top`` (within the rule's ``n_keep``), ``within``/``beyond`` (the
    margin), ``everyone`` (the spread within the margin), ``tolerance`` (everyone within the
    tolerance), ``unranked`` (no prediction), ``shown-worse``/``not-shown-worse`` (a test), or
    ``first`` (the first prediction at a rung). ``gap``: the score's distance above the best."""

    clause: str
    rank: int = 0
    n: int = 0
    predicted: Optional[float] = None
    uncertainty: Optional[float] = None
    gap: float = 0.0
    note: str = ""  # a rule's own numbers (a test statistic)


@dataclass(frozen=True)
class KeepDecision:
    """What a rule decided at one rung, and what it used.

    Attributes:
        kept: ids kept, ranked ones first in rank order, then those without a prediction.
        stopped: ids stopped, in rank order.
        ranked: ids with a prediction, in rank order.
        clauses: id → the :class:`Clause` that kept or stopped it.
        predicted_best: the best-ranked id (the rung's pick; None when nobody is ranked).
        current_best: the id with the lowest loss at the rung.
        n_keep: how many the rule keeps before the margin (⌈n/rf⌉, 1 at the last rung, k).
        margin: the log margin applied (after the tolerance).
        kept_all: every ranked trial lay within the margin of the best: everyone kept.
        weight: the order ranked by (``predictors.ranking.Order``: 1 = predicted finals, 0 =
            the losses at the rung); sigma: the σ of that order behind the margin and P(best)
            (None: unknown); tolerance: the tolerance applied (log units).
        words: where the margin came from (the rule and its terms in numbers).
    """

    kept: tuple[str, ...]
    stopped: tuple[str, ...]
    ranked: tuple[str, ...]
    clauses: Mapping[str, Clause]
    predicted_best: Optional[str]
    current_best: Optional[str]
    n_keep: int
    margin: float
    kept_all: bool
    weight: float = 1.0
    sigma: Optional[float] = None
    tolerance: float = 0.0
    words: str = ""

    @property
    def order(self) -> str:
        return Order(self.weight, None, "").name

    def reason(self, trial_id: str, derivation: bool = True) -> str:
        """The decision on one trial in words (:func:`clause_words`)."""
        return clause_words(self.clauses[trial_id], self, derivation)

    @property
    def reasons(self) -> dict[str, str]:
        """id → the decision in words (every trial's; :meth:`reason` for one)."""
        return {tid: clause_words(c, self) for tid, c in self.clauses.items()}


def clause_words(c: Clause, d: KeepDecision, derivation: bool = True) -> str:
    """A trial's clause in the words the decision log keeps (the one place they are made).
    ``derivation``: the margin's terms too (``d.words``); a rung decided at once records them
    once, in its ``margin_source``, not in each of its 10,000 trials' reasons."""
    if c.clause == "unranked":
        return "no prediction: kept"
    if c.clause == "first":
        return f"predicted {c.predicted:.4f}: the first prediction recorded at this rung"
    if c.clause in ("shown-worse", "not-shown-worse"):
        return (f"paired test: {c.note}: stopped" if c.clause == "shown-worse" else
                "paired test: not shown worse than the current best: kept")
    unc = f"±{c.uncertainty:.4f}" if c.uncertainty is not None else ""
    by = "" if d.weight >= 1.0 else f" (ranked by {d.order})"
    words = f" ({d.words})" if d.words and derivation else ""
    place = f"predicted {c.predicted:.4f}{unc}{by} is {c.rank} of {c.n}"
    if c.clause == "everyone":
        return (f"predicted {c.predicted:.4f}{unc}; the spread of all {c.n} predictions, {100 * c.gap:.2f}%, "
                f"is within the margin {100 * d.margin:.2f}%{words}: keeping everyone")
    if c.clause == "best":
        return f"{place}: the predicted best"
    if c.clause == "top":
        return f"{place}; keeping the top {d.n_keep}"
    text = f"{place}, {100 * c.gap:.2f}% above the best: {c.clause} the margin {100 * d.margin:.2f}%{words}"
    if c.clause == "tolerance":
        text = (f"{place}, {100 * c.gap:.2f}% above the best: beyond the margin {100 * d.margin:.2f}%{words}; "
                f"all {c.n} lie within the tolerance {100 * d.tolerance:.2f}% of the best "
                f"(the same result within seed noise): keeping the top {d.n_keep}")
    return text


def score(c: Candidate, weight: float = 1.0) -> float:
    """The log-score a rung ranks by: w·log(predicted final) + (1 − w)·log(loss at the rung)
    (the predicted final alone when the loss is unknown); lower is better."""
    log_p = math.log(c.predicted) if c.predicted else math.inf
    if weight >= 1.0 or c.loss is None or not (math.isfinite(c.loss) and c.loss > 0):
        return log_p
    return weight * log_p + (1.0 - weight) * math.log(c.loss)


def rank_key(c: Candidate, weight: float = 1.0) -> tuple[float, float, str]:
    """Rank by :func:`score`; ties by the loss at the rung, then trial id."""
    return (score(c, weight), c.loss if c.loss is not None and math.isfinite(c.loss) else math.inf, c.trial_id)


def current_best(candidates: Iterable[Candidate]) -> Optional[str]:
    """The id with the lowest loss at the rung (ties: trial id); None without losses."""
    known = [c for c in candidates if c.loss is not None and math.isfinite(c.loss)]
    return min(known, key=lambda c: (c.loss, c.trial_id)).trial_id if known else None


def keep_rule(
    candidates: Sequence[Candidate], *, last: bool, reduction_factor: float, margin: float, margin_words: str = "",
    weight: float = 1.0, tolerance: float = 0.0, tolerance_loss: Optional[float] = None,
    n_keep: Optional[int] = None, sigma: Optional[float] = None,
) -> KeepDecision:
    """Rank the trials with a prediction by :func:`score` with ``weight``; keep the best
    ``n_keep`` (default ⌈n/rf⌉, 1 at the last rung), plus every trial within ``margin`` less
    the tolerance of the best. ``tolerance`` (log units) or ``tolerance_loss`` (loss units,
    relative to the best's predicted final) is how close counts as the same result: when every
    ranked trial lies within it the rung keeps ``n_keep``, never everyone. Trials without a
    prediction are always kept and do not count towards ``n_keep``.

    Example:
        >>> cands = [Candidate("a", 2.000, 2.3), Candidate("b", 2.004, 2.3), Candidate("c", 2.006, 2.3),
        ...          Candidate("d", 2.008, 2.3)]
        >>> keep_rule(cands, last=False, reduction_factor=2, margin=0.02, tolerance=0.01).kept
        ('a', 'b')
    """
    if not reduction_factor > 1.0:
        raise ValueError(f"reduction_factor: must be > 1, got {reduction_factor!r}")
    if not (margin >= 0.0 and (math.isfinite(margin) or n_keep is not None)):
        raise ValueError(f"margin: must be a finite number >= 0, got {margin!r}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight: must lie in [0, 1], got {weight!r}")
    ranked = sorted((c for c in candidates if c.predicted is not None and c.predicted > 0),
                    key=lambda c: rank_key(c, weight))
    ranked_ids = {c.trial_id for c in ranked}
    n = len(ranked)
    n_rule = int(n_keep) if n_keep is not None else 1 if last else math.ceil(n / reduction_factor)
    best = ranked[0] if ranked else None
    if tolerance_loss is not None and best is not None:
        tolerance = max(float(tolerance_loss), 0.0) / float(best.predicted)  # type: ignore[arg-type]
    tolerance = max(float(tolerance), 0.0)
    spread = score(ranked[-1], weight) - score(best, weight) if n > 1 and best else 0.0
    # Keeping a trial past n_keep buys at most what it could still win over the best: the
    # margin less the tolerance. Everyone within the tolerance: no trial can matter, n_keep.
    within_tolerance = n > 1 and spread <= tolerance + 1e-12
    margin = 0.0 if within_tolerance else max(float(margin) - tolerance, 0.0)
    # A margin of 0 keeps exactly the rule's survivors, even on an exact tie.
    kept_all = n > 1 and margin > 0 and spread <= margin + 1e-12
    clauses: dict[str, Clause] = {}
    kept: list[str] = []
    stopped: list[str] = []
    for i, c in enumerate(ranked):
        gap = score(c, weight) - score(best, weight)  # type: ignore[arg-type]
        keep = i < n_rule or (margin > 0 and gap <= margin + 1e-12)
        (kept if keep else stopped).append(c.trial_id)
        what = ("everyone" if kept_all else "best" if i == 0 else "top" if i < n_rule else "within" if keep
                else "tolerance" if within_tolerance else "beyond")
        clauses[c.trial_id] = Clause(what, i + 1, n, c.predicted, c.uncertainty, spread if kept_all else gap)
    for c in candidates:
        if c.trial_id not in ranked_ids:
            kept.append(c.trial_id)
            clauses[c.trial_id] = Clause("unranked")
    return KeepDecision(tuple(kept), tuple(stopped), tuple(c.trial_id for c in ranked), clauses,
                        best.trial_id if best else None, current_best(candidates), n_rule, float(margin), kept_all,
                        weight, sigma, tolerance, margin_words)


class KeepRule:
    """The keep/stop rule at a rung: one method, :meth:`decide`. Subclasses are one a module
    (``hpo.decisions.keep``); each states its rule in its docstring with a runnable example and
    validates its knobs in its constructor (``scheduler.rule: {name: ..., knob: ...}``)."""

    name = "rule"
    #: Whether :meth:`decide` reads where the trials stood at the previous look
    #: (``TrialEvidence.previous``); the scheduler predicts that look only for a rule that does.
    reads_previous_look = False
    #: The rule in a few words (the decision log's margin source for a rule without a margin).
    words = ""

    def decide(self, evidence: RungEvidence) -> KeepDecision:  # pragma: no cover - the interface
        raise NotImplementedError

    def judge_arrival(self, evidence: RungEvidence, arrival: str) -> KeepDecision:
        """One trial (``arrival``) judged against the others recorded at the rung, as ASHA judges
        a late or asynchronous arrival: the decision over them all (the arrival's clause says
        its fate); the first prediction, and a trial without one, are kept (``n_keep`` 0: no
        decision over the rung was made)."""
        mine = next(t for t in evidence.trials if t.candidate.trial_id == arrival)
        others = [t for t in evidence.trials if t.candidate.trial_id != arrival and t.candidate.predicted is not None]
        if mine.candidate.predicted is None or not others:
            c = mine.candidate
            clause = Clause("unranked") if c.predicted is None else Clause("first", 1, 1, c.predicted)
            return KeepDecision((arrival,), (), (), {arrival: clause}, None, None, 0, 0.0, False)
        return self.decide(evidence.with_trials([*others, mine]))

    def settings(self) -> dict[str, object]:
        """The rule's name and knobs, as ``scheduler.rule``, the state file and MLflow record them."""
        return {"name": self.name}


def check_knob(name: str, value: Any, *, least: float = 0.0, integer: bool = False) -> Any:
    """A rule's knob checked in its constructor (the one validation): a finite number ≥ ``least``
    (a whole one when ``integer``); ValueError naming the knob otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= least
    if not ok or (integer and int(value) != value):
        raise ValueError(f"{name}: must be a finite {'whole ' if integer else ''}number >= {least:g}, got {value!r}")
    return int(value) if integer else float(value)


__all__ = ["Candidate", "Clause", "KeepDecision", "KeepRule", "RungEvidence", "TrialEvidence", "check_knob",
           "clause_words", "current_best", "gather", "keep_rule", "rank_key", "score"]
