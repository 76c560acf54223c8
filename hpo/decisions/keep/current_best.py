"""Current-best: rank by the loss at the rung, keep the top ⌈n/rf⌉, and at the last rung only
the lowest loss. With one rung at s it is "current-best at s": every trial to s, the best there
to the end (the simplest baseline, and the one to beat).

Example:
    >>> from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence
    >>> ev = RungEvidence(0.2, True, 2.0, tuple(TrialEvidence(Candidate(t, p, l)) for t, p, l in
    ...                   [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6)]))
    >>> CurrentBestRule().decide(ev).kept
    ('b',)
"""

from __future__ import annotations

from hpo.decisions.keep.evidence import KeepDecision, KeepRule, RungEvidence, keep_rule


class CurrentBestRule(KeepRule):
    name = "current-best"
    #: Whether the last rung keeps only the lowest loss (ASHA's rule keeps ⌈n/rf⌉ there too).
    one_at_last = True
    words = "current-best: the lowest losses at the rung"

    def decide(self, ev: RungEvidence) -> KeepDecision:
        # σ is known only when calibration measured this order (the losses at the rung) best.
        return keep_rule(ev.candidates, last=ev.last and self.one_at_last, reduction_factor=ev.reduction_factor,
                         margin=0.0, margin_words=self.words, weight=0.0, sigma=ev.scale if ev.weight <= 0 else None)
