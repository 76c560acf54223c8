"""Top-k: keep the k best by predicted final at every rung; the last rung's k train to the end.

Example:
    >>> from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence
    >>> ev = RungEvidence(0.3, True, 2.0, tuple(TrialEvidence(Candidate(t, p, l)) for t, p, l in
    ...                   [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6)]))
    >>> TopKRule(k=2).decide(ev).kept
    ('a', 'b')
"""

from __future__ import annotations

from hpo.decisions.keep.evidence import KeepDecision, KeepRule, RungEvidence, check_knob, keep_rule


class TopKRule(KeepRule):
    """Args: k: how many trials continue past each rung (≥ 1)."""

    name = "top-k"

    def __init__(self, k: int = 2) -> None:
        self.k = check_knob("k", k, least=1, integer=True)

    def settings(self) -> dict[str, object]:
        return {"name": self.name, "k": self.k}

    def decide(self, ev: RungEvidence) -> KeepDecision:
        # σ is known only when calibration measured this order (the predicted finals) best.
        return keep_rule(ev.candidates, last=ev.last, reduction_factor=ev.reduction_factor, margin=0.0, n_keep=self.k,
                         margin_words=f"top-{self.k}: the {self.k} best predicted finals",
                         sigma=ev.scale if ev.weight >= 1.0 else None)
