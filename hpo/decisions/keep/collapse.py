"""The collapse rule: keep the trials whose score is within z·σ of the predicted best.

The score is the calibrated order (w·log P + (1 − w)·log L: predicted finals P, losses at the
rung L; ``predictors.ranking``). σ combines what calibration measured on *other* corpora with
what this sweep shows about itself, in quadrature:

    σ² = σ_calibrated² + σ_moved² + σ_misfit²

σ_moved is how far the trials' scores moved against each other since the previous look, σ_misfit
how badly the curves fit the predicted shape (``RungEvidence.movement`` / ``.misfit``): a sweep
whose order is still moving, or whose curves are not the predicted shape, gets a wider margin;
one that has settled is held to the calibrated one. Beyond the top ⌈n/rf⌉ (1 at the last rung),
a trial is kept if its score is within z·σ less the tolerance (seed noise) of the best
(``keep_rule``). Each rung is a look: with several rungs the chance of stopping the true best
adds up over the looks (as Optuna's Wilcoxon pruner warns of its repeated tests); the default is
one rung.

Example:
    >>> from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence
    >>> still = [TrialEvidence(Candidate(t, p, 2.5), Candidate(t, p, 2.9)) for t, p in
    ...          [("a", 2.00), ("b", 2.03), ("c", 2.06), ("d", 2.30)]]
    >>> moving = [TrialEvidence(Candidate(t, p, 2.5), Candidate(t, q, 2.9)) for t, p, q in
    ...           [("a", 2.00, 2.10), ("b", 2.03, 1.90), ("c", 2.06, 1.95), ("d", 2.30, 2.30)]]
    >>> rule = CollapseRule(margin_z=1.0)
    >>> rule.decide(RungEvidence(0.1, False, 2.0, tuple(still), scale=0.01)).kept
    ('a', 'b')
    >>> rule.decide(RungEvidence(0.1, False, 2.0, tuple(moving), scale=0.01)).kept
    ('a', 'b', 'c')
"""

from __future__ import annotations

import math
from typing import Optional

from hpo.decisions.keep.evidence import KeepDecision, KeepRule, RungEvidence, check_knob, keep_rule
from predictors.ranking import Order

#: The default keep-margin in units of the rung's σ: chosen leave-one-corpus-out by
#: ``benchmarks/decisions.py::select_default``, the cheapest collapse setting that picked within
#: σ_seed on ≥ 90% and kept the true best on ≥ 95% of the replicates of each development corpus
#: (stdlib, Perl, C headers); docs/decisions.md has the held-out figures, misses included.
DEFAULT_MARGIN_Z = 0.5


class CollapseRule(KeepRule):
    """Args: margin_z: the margin in units of σ; read_sweep: add the sweep's own evidence to σ
    (False: the calibrated σ alone, the rule before the sweep was read)."""

    name = "collapse"

    def __init__(self, margin_z: float = DEFAULT_MARGIN_Z, read_sweep: bool = True) -> None:
        self.margin_z = check_knob("margin_z", margin_z)
        if not isinstance(read_sweep, bool):
            raise ValueError(f"read_sweep: must be true or false, got {read_sweep!r}")
        self.read_sweep = read_sweep

    @property
    def reads_previous_look(self) -> bool:  # type: ignore[override]
        return self.read_sweep

    def settings(self) -> dict[str, object]:
        return {"name": self.name, "margin_z": self.margin_z, "read_sweep": self.read_sweep}

    def margin(self, ev: RungEvidence) -> tuple[float, Optional[float], str]:
        """(margin in log units, the σ it is z of, the words the decision log keeps: every term in numbers)."""
        if ev.fixed_margin is not None:
            return (ev.fixed_margin, ev.scale if ev.weight >= 1.0 else None,
                    f"fixed margin {100 * ev.fixed_margin:.2f}% on the predicted finals")
        calibrated = ev.scale or 0.0
        moved, misfit = (ev.movement(), ev.misfit()) if self.read_sweep else (None, None)
        sigma = math.sqrt(calibrated ** 2 + (moved or 0.0) ** 2 + (misfit or 0.0) ** 2)
        terms = [f"ranking scale {100 * calibrated:.2f}%" if ev.scale else "ranking scale unknown (0)"]
        terms += [f"moved since the last look {100 * moved:.2f}%"] if moved is not None else []
        terms += [f"misfit to the shape {100 * misfit:.2f}%"] if misfit is not None else []
        z = self.margin_z
        return z * sigma, sigma or None, (f"order: {Order(ev.weight, None, '').name}; {z:g} × √({'² + '.join(terms)}²)"
                                          f" = {100 * z * sigma:.2f}% ({ev.order_words}), less the "
                                          f"{ev.tolerance_words or 'tolerance'}")

    def decide(self, ev: RungEvidence) -> KeepDecision:
        value, sigma, words = self.margin(ev)
        return keep_rule(ev.candidates, last=ev.last, reduction_factor=ev.reduction_factor, margin=value,
                         margin_words=words, weight=1.0 if ev.fixed_margin is not None else ev.weight,
                         tolerance=ev.tolerance, tolerance_loss=ev.tolerance_loss, sigma=sigma)
