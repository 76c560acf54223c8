"""ASHA's rule (Li et al. 2020) at our rungs: keep the top ⌈n/rf⌉ by the loss at the rung, at
every rung, the last included (the survivors of the last rung all train to the end).

Example:
    >>> from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence
    >>> ev = RungEvidence(0.3, True, 2.0, tuple(TrialEvidence(Candidate(t, p, l)) for t, p, l in
    ...                   [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6)]))
    >>> AshaRule().decide(ev).kept
    ('b', 'a')
"""

from __future__ import annotations

from hpo.decisions.keep.current_best import CurrentBestRule


class AshaRule(CurrentBestRule):
    """Current-best's ranking, without its single pick at the last rung."""

    name = "asha"
    one_at_last = False
    words = "ASHA: the top 1/rf by the loss at the rung"
