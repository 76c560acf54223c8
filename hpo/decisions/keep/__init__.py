"""The keep rules, one a module, behind one seam (:class:`~hpo.decisions.keep.evidence.KeepRule`):
the collapse rule (the default), ASHA's, current-best, top-k and a paired test (experimental).
``scheduler.rule`` names one, bare or with its knobs (``{name: collapse, margin_z: 0.5}``);
:func:`make_rule` builds it, and the rule's constructor is the one check of its knobs.

Example:
    >>> make_rule("asha").name, make_rule({"name": "top-k", "k": 3}).settings()
    ('asha', {'name': 'top-k', 'k': 3})
"""

from __future__ import annotations

from typing import Any, Mapping, Union

from hpo.decisions.keep.asha import AshaRule
from hpo.decisions.keep.collapse import DEFAULT_MARGIN_Z, CollapseRule
from hpo.decisions.keep.current_best import CurrentBestRule
from hpo.decisions.keep.evidence import Candidate, KeepDecision, KeepRule, RungEvidence, TrialEvidence, gather
from hpo.decisions.keep.paired_test import PairedTestRule
from hpo.decisions.keep.top_k import TopKRule

RULES: dict[str, type[KeepRule]] = {r.name: r for r in (CollapseRule, AshaRule, CurrentBestRule, PairedTestRule,
                                                        TopKRule)}


def make_rule(settings: Union[str, Mapping[str, Any], KeepRule]) -> KeepRule:
    """The rule ``settings`` names (``scheduler.rule``: a name, or ``{name: ..., knob: ...}`` as
    ``KeepRule.settings()`` writes it; a rule is returned as it is); ValueError naming the known
    rules, or the knob its constructor refuses."""
    if isinstance(settings, KeepRule):
        return settings
    knobs = {"name": settings} if isinstance(settings, str) else dict(settings)
    name = knobs.pop("name", "collapse")  # knobs without a name: the default rule's
    if name not in RULES:
        raise ValueError(f"scheduler.rule: {name!r} is not a rule; known: {', '.join(RULES)}")
    try:
        return RULES[name](**knobs)
    except TypeError:
        known = RULES[name]().settings()
        raise ValueError(f"scheduler.rule: {name} takes {', '.join(k for k in known if k != 'name') or 'no knobs'}, "
                         f"got {', '.join(sorted(knobs))}") from None


__all__ = ["AshaRule", "Candidate", "CollapseRule", "CurrentBestRule", "DEFAULT_MARGIN_Z", "KeepDecision", "KeepRule",
           "PairedTestRule", "RULES", "RungEvidence", "TopKRule", "TrialEvidence", "gather", "make_rule"]
