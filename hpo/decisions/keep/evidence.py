"""What a keep rule is shown at one rung, and the one method every rule answers.

:class:`RungEvidence` is the typed record of a rung: each trial's prediction and loss at the
rung, where it stood at the previous look, how well its curve fits the predicted shape, its
history; and the calibrated order (its blend weight and ranking scale) and tolerance for the
sweep's kind. :class:`KeepRule` is the seam (Optuna's ``BasePruner`` is the model): one method,
``decide(evidence) -> KeepDecision``; the scheduler calls the configured one
(``scheduler.rule``), the decision benchmark replays every one on the same banks.

Example:
    >>> from hpo.decisions.rules import Candidate
    >>> ev = RungEvidence(0.1, False, 2.0, tuple(TrialEvidence(Candidate(t, p, l)) for t, p, l in
    ...                   [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6)]))
    >>> [c.trial_id for c in ev.candidates]
    ['a', 'b', 'c']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from hpo.decisions import rules


@dataclass(frozen=True)
class TrialEvidence:
    """One trial at a rung: its :class:`~hpo.decisions.rules.Candidate` (prediction and loss
    at the rung), the same at the previous look (``previous``: the previous rung, or half this
    rung's t̂ at the first), the RMS relative residual of its alignment to the predicted shape
    (``residual``), and its (t̂, smoothed loss) history up to the rung."""

    candidate: rules.Candidate
    previous: Optional[rules.Candidate] = None
    residual: Optional[float] = None
    history: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class RungEvidence:
    """Everything a rule may read at one rung (see the module docstring). ``weight``/``scale``/
    ``order_words``: the calibrated order for ``kind`` (``predictors.ranking.Order``; scale None:
    unknown); ``tolerance`` (log units) or ``tolerance_loss`` (loss units): how close counts as
    the same result; ``fixed_margin``: a margin the user set in log units (None: calibrated)."""

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

    @classmethod
    def of(cls, margin: rules.Margin, fraction: float, *, last: bool, reduction_factor: float,
           trials: Sequence[TrialEvidence]) -> "RungEvidence":
        """The evidence of a rung from its calibrated :class:`~hpo.decisions.rules.Margin`
        (``rules.rung_margin``) and its trials."""
        return cls(fraction, last, reduction_factor, tuple(trials), margin.kind, margin.weight, margin.sigma or None,
                   margin.order_words, margin.tolerance, margin.tolerance_loss, margin.tolerance_words,
                   margin.value if margin.fixed else None)

    @property
    def candidates(self) -> list[rules.Candidate]:
        return [t.candidate for t in self.trials]

    def movement(self) -> Optional[float]:
        """How far the trials' scores moved against each other since the previous look: √2 × the
        standard deviation over trials of Δ(score) (a shift they all share does not change the
        order; √2 puts it on the ranking scale of a pair). None with fewer than 3 trials seen
        at both looks."""
        moves = [rules.score(t.candidate, self.weight) - rules.score(t.previous, self.weight) for t in self.trials
                 if t.previous is not None and t.candidate.predicted and t.previous.predicted]
        moves = [m for m in moves if math.isfinite(m)]
        return float(math.sqrt(2.0) * np.std(moves, ddof=1)) if len(moves) >= 3 else None

    def misfit(self) -> Optional[float]:
        """How badly the curves fit the predicted shape, on the ranking scale: √2 × the blend
        weight × the RMS over trials of each alignment's relative residual (the losses at the
        rung, weight 0, do not depend on the shape). None when no residual is known."""
        res = [t.residual for t in self.trials if t.residual is not None and math.isfinite(t.residual)]
        return float(math.sqrt(2.0) * self.weight * math.sqrt(np.mean(np.square(res)))) if res else None


class KeepRule:
    """The keep/stop rule at a rung: one method, :meth:`decide`. Subclasses are one a module
    (``hpo.decisions.keep``); each states its rule in its docstring with a runnable example."""

    name = "rule"
    #: Whether :meth:`decide` reads where the trials stood at the previous look
    #: (``TrialEvidence.previous``); the scheduler predicts that look only for a rule that does.
    reads_previous_look = False

    def decide(self, evidence: RungEvidence) -> rules.KeepDecision:  # pragma: no cover - the interface
        raise NotImplementedError

    def judge_arrival(self, evidence: RungEvidence, arrival: str) -> tuple[bool, str]:
        """One trial (``arrival``) judged against the others recorded at the rung, as ASHA judges
        a late or asynchronous arrival: the first prediction, and a trial without one, are kept."""
        mine = next(t for t in evidence.trials if t.candidate.trial_id == arrival)
        others = [t for t in evidence.trials if t.candidate.trial_id != arrival and t.candidate.predicted is not None]
        if mine.candidate.predicted is None:
            return True, "no prediction: kept"
        if not others:
            return True, f"predicted {mine.candidate.predicted:.4f}: the first prediction recorded at this rung"
        decision = self.decide(_replace_trials(evidence, [*others, mine]))
        return arrival in decision.kept, decision.reasons[arrival] + f" (against {len(others)} recorded)"

    def settings(self) -> dict[str, object]:
        """The rule's name and knobs, as the state file and MLflow params record them."""
        return {"rule": self.name}


def _replace_trials(evidence: RungEvidence, trials: Sequence[TrialEvidence]) -> RungEvidence:
    import dataclasses

    return dataclasses.replace(evidence, trials=tuple(trials))
