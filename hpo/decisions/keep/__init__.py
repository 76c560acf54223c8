"""The keep rules, one a module, behind one seam (:class:`~hpo.decisions.keep.evidence.KeepRule`):
the collapse rule (the default), ASHA's, current-best and a paired test. ``scheduler.rule``
names one; :func:`make_rule` builds it.

Example:
    >>> make_rule("asha").name
    'asha'
"""

from __future__ import annotations

from typing import Any

from hpo.decisions.keep.asha import AshaRule
from hpo.decisions.keep.collapse import CollapseRule
from hpo.decisions.keep.current_best import CurrentBestRule
from hpo.decisions.keep.evidence import KeepRule, RungEvidence, TrialEvidence
from hpo.decisions.keep.paired_test import PairedTestRule

RULES: dict[str, type[KeepRule]] = {r.name: r for r in (CollapseRule, AshaRule, CurrentBestRule, PairedTestRule)}


def make_rule(name: str, **knobs: Any) -> KeepRule:
    """The rule called ``name`` (``scheduler.rule``) with the knobs it takes (the collapse rule:
    ``z``, ``read_sweep``; the paired test: ``z``); ValueError naming the known rules."""
    if name not in RULES:
        raise ValueError(f"scheduler.rule: {name!r} is not a rule; known: {', '.join(RULES)}")
    return RULES[name](**knobs)


__all__ = ["AshaRule", "CollapseRule", "CurrentBestRule", "KeepRule", "PairedTestRule", "RULES", "RungEvidence",
           "TrialEvidence", "make_rule"]
