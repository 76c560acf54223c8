"""The keep rules behind one seam (hpo.decisions.keep): what each keeps, that the collapse
rule widens its margin where the sweep's own curves say its order is weak, and that a rule is
swapped in by config."""

from __future__ import annotations

import pytest

from hpo.decisions.keep import AshaRule, CollapseRule, CurrentBestRule, PairedTestRule, RULES, TopKRule, make_rule
from hpo.decisions.keep.evidence import Candidate, RungEvidence, TrialEvidence, keep_rule


def _ev(trials, **kw) -> RungEvidence:
    return RungEvidence(kw.pop("fraction", 0.2), kw.pop("last", True), 2.0, tuple(trials), **kw)


def test_an_arrival_is_judged_against_the_recorded_predictions() -> None:
    # The first prediction at a rung continues; a later one is judged by the same rule.
    rule = CollapseRule(margin_z=1.0)
    first = _ev([TrialEvidence(Candidate("a", 1.0, 1.2))], scale=0.02)
    assert rule.judge_arrival(first, "a").kept == ("a",)
    d = rule.judge_arrival(_ev([TrialEvidence(Candidate("a", 1.0, 1.2)),
                                TrialEvidence(Candidate("b", 1.05, 1.2))], scale=0.02), "b")
    assert d.stopped == ("b",) and "beyond the margin" in d.reason("b")
    # The decision says what it used: the order, the σ behind the margin, the margin, the clause.
    assert (d.order, d.sigma, d.margin, d.clauses["b"].clause) == ("predicted finals", 0.02, 0.02, "beyond")


def test_curves_that_disagree_with_the_predicted_shape_get_a_wider_margin() -> None:
    # Same predictions and calibrated scale; in one sweep the curves fit the shape (residual
    # 0.1%) and the predictions stood still since the last look, in the other the curves miss
    # the shape by 3% and the predictions moved against each other by several percent.
    finals = {"a": 2.00, "b": 2.03, "c": 2.05, "d": 2.08}
    moved = {"a": 2.10, "b": 1.93, "c": 1.98, "d": 2.12}
    fits = [TrialEvidence(Candidate(t, p, 2.4), Candidate(t, p, 2.8), residual=0.001) for t, p in finals.items()]
    misfits = [TrialEvidence(Candidate(t, p, 2.4), Candidate(t, moved[t], 2.8), residual=0.03) for t, p in finals.items()]
    rule = CollapseRule(margin_z=1.0)
    narrow, _, why_narrow = rule.margin(_ev(fits, scale=0.01))
    wide, sigma_wide, why_wide = rule.margin(_ev(misfits, scale=0.01))
    assert wide > 3 * narrow
    assert narrow == pytest.approx(0.01, rel=0.05)
    # The decision log states the evidence in numbers.
    assert "moved since the last look" in why_wide and "misfit to the shape 4.24%" in why_wide
    assert rule.decide(_ev(misfits, scale=0.01)).sigma == pytest.approx(sigma_wide) == pytest.approx(wide)
    assert set(rule.decide(_ev(misfits, scale=0.01)).kept) > set(rule.decide(_ev(fits, scale=0.01)).kept)
    # Read without the sweep, the two sweeps get the same margin.
    blind = CollapseRule(margin_z=1.0, read_sweep=False)
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


def test_a_rule_is_swapped_in_by_config_with_its_knobs() -> None:
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.decisions.scheduler_contract import SchedulerSettings

    assert set(RULES) == {"collapse", "asha", "current-best", "paired-test", "top-k"}
    assert SchedulerSettings(rule="asha").rule == {"name": "asha"}
    assert SchedulerSettings(rule={"name": "collapse", "margin_z": 1.0}).rule["margin_z"] == 1.0
    assert SchedulerSettings(margin_z=0.25).rule["margin_z"] == 0.25  # the key before the rule took its knobs
    with pytest.raises(ValueError, match="scheduler.rule"):
        make_rule("hyperband")
    # The rule's constructor is the one check of its knobs; the config reports what it says.
    for bad, says in [({"name": "top-k", "k": 0}, "k: must be"), ({"name": "collapse", "margin_z": -1}, "margin_z"),
                      ({"name": "asha", "k": 2}, "asha takes no knobs")]:
        with pytest.raises(ValueError, match=says):
            SchedulerSettings(rule=bad)

    class Predictor:
        def predict_final(self, t_hat, loss, controls):  # pragma: no cover - never asked here
            raise AssertionError

    for name in RULES:
        s = CollapseScheduler(predictor=Predictor(), settings=SchedulerSettings(rule=name))
        assert s._judge.rule.name == name and s._state.settings["rule"] == make_rule(name).settings()


def test_top_k_keeps_the_k_best_predicted_finals_at_every_rung() -> None:
    trials = [TrialEvidence(Candidate(t, p, l)) for t, p, l in [("a", 2.0, 2.5), ("b", 2.1, 2.4), ("c", 2.3, 2.6),
                                                                   ("d", 2.4, 2.7)]]
    assert TopKRule(k=3).decide(_ev(trials, last=False)).kept == ("a", "b", "c")
    assert TopKRule(k=2).decide(_ev(trials, last=True)).kept == ("a", "b")
    assert TopKRule(k=2).settings() == {"name": "top-k", "k": 2}


# ---------------------------------------------------------------------- the ranking mechanics (keep_rule)


def _c(tid: str, predicted: float | None, loss: float = 2.0) -> Candidate:
    return Candidate(tid, predicted, loss)


def test_keep_rule_keeps_the_top_share_and_everyone_within_the_margin() -> None:
    # Intermediate rung, 5 trials, rf 2: the best ⌈5/2⌉ = 3 continue, plus the 4th, which is
    # within the 2% margin of the best; the 5th is stopped.
    cands = [_c("a", 1.00), _c("b", 1.005), _c("c", 1.01), _c("d", 1.015), _c("e", 1.10)]
    d = keep_rule(cands, last=False, reduction_factor=2, margin=0.02)
    assert d.kept == ("a", "b", "c", "d") and d.stopped == ("e",) and d.n_keep == 3
    # At the last rung only the best plus the margin survive.
    d = keep_rule(cands, last=True, reduction_factor=2, margin=0.008)
    assert d.kept == ("a", "b") and d.predicted_best == "a"


def test_ties_are_broken_by_the_loss_at_the_rung_then_the_trial_id() -> None:
    # Identical predictions with margin 0 keep exactly one: the lower current loss, then the id.
    d = keep_rule([_c("a", 1.0, loss=2.2), _c("b", 1.0, loss=2.1)], last=True, reduction_factor=2, margin=0.0)
    assert d.kept == ("b",)
    d = keep_rule([_c("z", 1.0), _c("y", 1.0)], last=True, reduction_factor=2, margin=0.0)
    assert d.kept == ("y",)


def test_a_bias_every_trial_shares_does_not_change_the_decision() -> None:
    # The rule compares log-ratios: scaling every prediction by 0.95 keeps the same set.
    preds = {"a": 1.00, "b": 1.012, "c": 1.03, "d": 1.2}
    plain = keep_rule([_c(t, p) for t, p in preds.items()], last=True, reduction_factor=2, margin=0.015)
    biased = keep_rule([_c(t, 0.95 * p) for t, p in preds.items()], last=True, reduction_factor=2, margin=0.015)
    assert plain.kept == biased.kept == ("a", "b")


def test_a_trial_without_a_prediction_is_kept_and_not_counted() -> None:
    # Never stopped on no evidence; ⌈n/rf⌉ counts only the ranked trials (⌈2/2⌉ = 1 here).
    d = keep_rule([_c("a", 1.0), _c("b", 1.3), _c("x", None)], last=False, reduction_factor=2, margin=0.0)
    assert d.kept == ("a", "x") and d.stopped == ("b",) and d.reasons["x"] == "no prediction: kept"


def test_everyone_is_kept_when_the_spread_is_within_the_margin() -> None:
    d = keep_rule([_c("a", 1.0), _c("b", 1.01), _c("c", 1.02)], last=True, reduction_factor=2, margin=0.03)
    assert d.kept_all and set(d.kept) == {"a", "b", "c"} and "keeping everyone" in d.reasons["c"]


def test_keep_rule_ranks_by_the_order_it_is_given():
    # Issue 25: weight 1 ranks by the predicted finals, weight 0 by the losses at the rung
    # (current-best's order); the reasons say which order ranked a trial.

    cands = [Candidate("a", 2.00, 2.40), Candidate("b", 2.10, 2.20), Candidate("c", 2.30, 2.30)]
    by_prediction = keep_rule(cands, last=True, reduction_factor=2, margin=0.0, weight=1.0)
    by_loss = keep_rule(cands, last=True, reduction_factor=2, margin=0.0, weight=0.0)
    assert by_prediction.kept == ("a",) and by_loss.kept == ("b",)
    assert "ranked by losses at the rung" in by_loss.reasons["b"]


def test_keep_rule_within_the_tolerance_keeps_the_rule_survivors_only():
    # Every prediction within the tolerance (loss units here, relative to the best's predicted
    # final): ⌈n/rf⌉ kept though the margin covers everyone; beyond it, the margin shrinks by it.

    cands = [Candidate(str(i), 2.0 + 0.002 * i, 2.3) for i in range(5)]
    assert keep_rule(cands, last=False, reduction_factor=2, margin=0.05).kept_all
    tight = keep_rule(cands, last=False, reduction_factor=2, margin=0.05, tolerance_loss=0.02)
    assert tight.kept == ("0", "1", "2") and not tight.kept_all
    spread = [Candidate(str(i), 2.0 * (1 + 0.01 * i), 2.3) for i in range(5)]
    shrunk = keep_rule(spread, last=True, reduction_factor=2, margin=0.025, tolerance=0.01)
    assert shrunk.kept == ("0", "1") and shrunk.margin == pytest.approx(0.015)
