"""A paired test on the sweep's own curves (experimental): stop a trial only when its loss is
worse than the current best's by more than the tolerance and by more than ``z`` standard errors
of their paired difference over the last half of the history (trials of one sweep see the same
data stream, so the difference is far less noisy than either loss). No reduction factor:
everything not shown worse continues. Each rung is another test: over several rungs the chance
of stopping the true best exceeds one test's (as Optuna's Wilcoxon pruner warns).

Example:
    >>> from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence
    >>> curve = lambda level: tuple((t / 10, level + 1 - t / 20 + 0.001 * (t % 2)) for t in range(1, 11))
    >>> trials = [TrialEvidence(Candidate(t, 2.0, curve(lv)[-1][1]), history=curve(lv)) for t, lv in
    ...           [("a", 2.0), ("b", 2.002), ("c", 2.2)]]
    >>> PairedTestRule().decide(RungEvidence(1.0, True, 2.0, tuple(trials), tolerance=0.002)).kept
    ('a', 'b')
"""

from __future__ import annotations

import math

import numpy as np

from hpo.decisions.keep.evidence import (Clause, KeepDecision, KeepRule, RungEvidence, check_knob, current_best,
                                         keep_rule)


class PairedTestRule(KeepRule):
    name = "paired-test"
    experimental = True
    words = "paired test on the curves against the current best"

    def __init__(self, z: float = 2.0, points: int = 8) -> None:
        self.z, self.points = check_knob("z", z), check_knob("points", points, least=2, integer=True)

    def settings(self) -> dict[str, object]:
        return {"name": self.name, "z": self.z, "points": self.points}

    def decide(self, ev: RungEvidence) -> KeepDecision:
        with_history = [t for t in ev.trials if len(t.history) >= 2 and t.candidate.loss]
        leader = min(with_history, key=lambda t: (t.candidate.loss, t.candidate.trial_id), default=None)
        if leader is None:  # nothing to test against: everyone continues
            return keep_rule(ev.candidates, last=False, reduction_factor=ev.reduction_factor, margin=0.0,
                             n_keep=len(ev.trials), weight=0.0, margin_words=self.words)
        grid = np.linspace(ev.fraction / 2, min(leader.history[-1][0], ev.fraction), self.points)

        def log_loss(h: tuple[tuple[float, float], ...]) -> np.ndarray:
            t, y = np.array(h).T
            return np.log(np.interp(grid, t, y))

        best = log_loss(leader.history)
        worse: dict[str, Clause] = {}
        for t in with_history:
            d = log_loss(t.history) - best
            se = float(np.std(d, ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.inf
            if d.mean() > ev.tolerance and d.mean() > self.z * se:
                worse[t.candidate.trial_id] = Clause("shown-worse", gap=float(d.mean()), note=(
                    f"{100 * d.mean():.2f}% above the current best, {d.mean() / max(se, 1e-12):.1f} SE"))
        kept = tuple(c.trial_id for c in ev.candidates if c.trial_id not in worse)
        clauses = {c.trial_id: worse.get(c.trial_id, Clause("not-shown-worse")) for c in ev.candidates}
        ranked = tuple(c.trial_id for c in sorted((c for c in ev.candidates if c.loss), key=lambda c: (c.loss, c.trial_id)))
        return KeepDecision(kept, tuple(worse), ranked, clauses, leader.candidate.trial_id, current_best(ev.candidates),
                            len(kept), 0.0, not worse, weight=0.0, tolerance=ev.tolerance, words=self.words)
