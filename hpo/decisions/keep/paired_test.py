"""A paired test on the sweep's own curves: stop a trial only when its loss is worse than the
current best's by more than the tolerance and by more than ``z`` standard errors of their paired
difference over the last half of the history (trials of one sweep see the same data stream, so
the difference is far less noisy than either loss). No reduction factor: everything not shown
worse continues.

Example:
    >>> from hpo.decisions.keep.evidence import RungEvidence, TrialEvidence
    >>> from hpo.decisions.rules import Candidate
    >>> curve = lambda level: tuple((t / 10, level + 1 - t / 20 + 0.001 * (t % 2)) for t in range(1, 11))
    >>> trials = [TrialEvidence(Candidate(t, 2.0, curve(lv)[-1][1]), history=curve(lv)) for t, lv in
    ...           [("a", 2.0), ("b", 2.002), ("c", 2.2)]]
    >>> PairedTestRule().decide(RungEvidence(1.0, True, 2.0, tuple(trials), tolerance=0.002)).kept
    ('a', 'b')
"""

from __future__ import annotations

import math

import numpy as np

from hpo.decisions import rules
from hpo.decisions.keep.evidence import KeepRule, RungEvidence


class PairedTestRule(KeepRule):
    name = "paired-test"

    def __init__(self, z: float = 2.0, points: int = 8) -> None:
        self.z, self.points = float(z), int(points)

    def settings(self) -> dict[str, object]:
        return {"rule": self.name, "z": self.z}

    def decide(self, ev: RungEvidence) -> rules.KeepDecision:
        with_history = [t for t in ev.trials if len(t.history) >= 2 and t.candidate.loss]
        leader = min(with_history, key=lambda t: (t.candidate.loss, t.candidate.trial_id), default=None)
        if leader is None:
            return rules.keep_rule(ev.candidates, last=False, reduction_factor=ev.reduction_factor, margin=math.inf)
        grid = np.linspace(ev.fraction / 2, min(leader.history[-1][0], ev.fraction), self.points)

        def log_loss(h: tuple[tuple[float, float], ...]) -> np.ndarray:
            t, y = np.array(h).T
            return np.log(np.interp(grid, t, y))

        best = log_loss(leader.history)
        worse: dict[str, str] = {}
        for t in with_history:
            d = log_loss(t.history) - best
            se = float(np.std(d, ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.inf
            if d.mean() > ev.tolerance and d.mean() > self.z * se:
                worse[t.candidate.trial_id] = f"{100 * d.mean():.2f}% above the current best, {d.mean() / max(se, 1e-12):.1f} SE"
        kept = tuple(c.trial_id for c in ev.candidates if c.trial_id not in worse)
        reasons = {c.trial_id: (f"paired test: {worse[c.trial_id]}: stopped" if c.trial_id in worse else
                                "paired test: not shown worse than the current best: kept") for c in ev.candidates}
        ranked = tuple(sorted((c.trial_id for c in ev.candidates if c.loss), key=lambda i: reasons[i]))
        return rules.KeepDecision(kept, tuple(worse), ranked, reasons, leader.candidate.trial_id,
                                  rules.current_best(ev.candidates), len(kept), 0.0, not worse)
