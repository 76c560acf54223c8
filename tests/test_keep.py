"""The keep rules behind one seam (hpo.decisions.keep): what each keeps, that the collapse
rule widens its margin where the sweep's own curves say its order is weak, and that a rule is
swapped in by config."""

from __future__ import annotations

import pytest

from hpo.decisions.keep import AshaRule, CollapseRule, CurrentBestRule, PairedTestRule, RULES, make_rule
from hpo.decisions.keep.evidence import RungEvidence, TrialEvidence
from hpo.decisions.rules import Candidate


def _ev(trials, **kw) -> RungEvidence:
    return RungEvidence(kw.pop("fraction", 0.2), kw.pop("last", True), 2.0, tuple(trials), **kw)


def test_an_arrival_is_judged_against_the_recorded_predictions() -> None:
    # The first prediction at a rung continues; a later one is judged by the same rule.
    rule = CollapseRule(z=1.0)
    first = _ev([TrialEvidence(Candidate("a", 1.0, 1.2))], scale=0.02)
    assert rule.judge_arrival(first, "a")[0]
    keep, reason = rule.judge_arrival(_ev([TrialEvidence(Candidate("a", 1.0, 1.2)),
                                           TrialEvidence(Candidate("b", 1.05, 1.2))], scale=0.02), "b")
    assert not keep and "beyond the margin" in reason


def test_curves_that_disagree_with_the_predicted_shape_get_a_wider_margin() -> None:
    # Same predictions and calibrated scale; in one sweep the curves fit the shape (residual
    # 0.1%) and the predictions stood still since the last look, in the other the curves miss
    # the shape by 3% and the predictions moved against each other by several percent.
    finals = {"a": 2.00, "b": 2.03, "c": 2.05, "d": 2.08}
    moved = {"a": 2.10, "b": 1.93, "c": 1.98, "d": 2.12}
    fits = [TrialEvidence(Candidate(t, p, 2.4), Candidate(t, p, 2.8), residual=0.001) for t, p in finals.items()]
    misfits = [TrialEvidence(Candidate(t, p, 2.4), Candidate(t, moved[t], 2.8), residual=0.03) for t, p in finals.items()]
    rule = CollapseRule(z=1.0)
    narrow, why_narrow = rule.margin(_ev(fits, scale=0.01))
    wide, why_wide = rule.margin(_ev(misfits, scale=0.01))
    assert wide > 3 * narrow
    assert narrow == pytest.approx(0.01, rel=0.05)
    # The decision log states the evidence in numbers.
    assert "moved since the last look" in why_wide and "misfit to the shape 4.24%" in why_wide
    assert set(rule.decide(_ev(misfits, scale=0.01)).kept) > set(rule.decide(_ev(fits, scale=0.01)).kept)
    # Read without the sweep, the two sweeps get the same margin.
    blind = CollapseRule(z=1.0, read_sweep=False)
    assert blind.margin(_ev(misfits, scale=0.01))[0] == pytest.approx(blind.margin(_ev(fits, scale=0.01))[0])


def test_the_baseline_rules_rank_by_the_loss_at_the_rung() -> None:
    trials = [TrialEvidence(Candidate(t, p, l)) for t, p, l in [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6),
                                                                   ("d", 2.4, 2.7)]]
    assert CurrentBestRule().decide(_ev(trials)).kept == ("b",)
    assert CurrentBestRule().decide(_ev(trials, last=False)).kept == ("b", "a")
    assert AshaRule().decide(_ev(trials)).kept == ("b", "a")  # ASHA: 1/rf at the last rung too


def test_the_paired_test_stops_only_what_the_paired_difference_shows_worse() -> None:
    def curve(level: float) -> tuple[tuple[float, float], ...]:
        return tuple((t / 10, level + 1 - t / 20 + 0.002 * (t % 3)) for t in range(1, 11))

    trials = [TrialEvidence(Candidate(t, 2.0, curve(lv)[-1][1]), history=curve(lv))
              for t, lv in [("a", 2.0), ("b", 2.001), ("c", 2.1)]]
    d = PairedTestRule().decide(_ev(trials, fraction=1.0, tolerance=0.002))
    assert d.kept == ("a", "b") and d.stopped == ("c",) and "SE" in d.reasons["c"]


def test_a_rule_is_swapped_in_by_config() -> None:
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.trials.sweep_config import SchedulerSettings

    assert set(RULES) == {"collapse", "asha", "current-best", "paired-test"}
    assert SchedulerSettings(rule="asha").rule == "asha"
    with pytest.raises(ValueError, match="scheduler.rule"):
        make_rule("hyperband")
    class Predictor:
        def predict_final(self, t_hat, loss, controls):  # pragma: no cover - never asked here
            raise AssertionError

    for name in RULES:
        s = CollapseScheduler(predictor=Predictor(), metric="loss", mode="min", rule=name)
        assert s._judge.rule.name == name and s._state.settings["rule"] == name
