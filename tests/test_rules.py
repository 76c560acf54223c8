"""The decision core (hpo/decisions/rules.py): the keep rule, kinds of sweep, probability, compute."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpo.decisions import rules
from hpo.decisions.rules import Candidate, keep_rule


def _c(tid: str, predicted: float | None, loss: float = 2.0) -> Candidate:
    return Candidate(tid, predicted, loss)


def test_keep_rule_keeps_the_top_share_and_everyone_within_the_margin() -> None:
    # Intermediate rung, 5 trials, rf 2: the best ⌈5/2⌉ = 3 continue, plus the 4th, which is
    # within the 2% margin of the best; the 5th is stopped.
    cands = [_c("a", 1.00), _c("b", 1.005), _c("c", 1.01), _c("d", 1.015), _c("e", 1.10)]
    d = keep_rule(cands, last=False, reduction_factor=2, margin=0.02)
    assert d.kept == ("a", "b", "c", "d") and d.stopped == ("e",) and d.n_rule == 3
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


@pytest.mark.parametrize("values, kind", [
    ([{"eta": 0.01, "batch_size": 2048, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}], "eta_fixed_tau"),
    ([{"eta": 0.01, "batch_size": 1024, "tau": 0.3}, {"eta": 0.01, "batch_size": 2048, "tau": 0.3}], "batch_fixed_tau"),
    ([{"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.6},
      {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.2, "tau": 0.3}], "lambda"),
    ([{"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.6},
      {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.1, "tau": 0.3}], "eta_fixed_lambda"),
    ([{"eta": 0.01, "batch_size": 1024, "tau": 0.3}, {"eta": 0.02, "batch_size": 2048, "tau": 0.3}], "fixed_tau"),
    ([{"tau": 0.3}, {"tau": 0.6}], "varying_tau"),
    ([{"tau": 0.3, "tokens_per_param": 20}, {"tau": 0.3, "tokens_per_param": 80}], "mixed"),
])
def test_sweep_kind(values, kind) -> None:
    assert rules.sweep_kind(values) == kind


def test_kind_groups_pair_runs_that_differ_only_in_the_swept_value() -> None:
    items = {
        "a": {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.10, "tau": 0.3, "seed": 1},
        "b": {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.05, "tau": 0.3, "seed": 1},
        "c": {"eta": 0.02, "batch_size": 2048, "weight_decay": 0.05, "tau": 0.3, "seed": 2},
        "d": {"eta": 0.01, "batch_size": 2048, "weight_decay": 0.1005, "tau": 0.6, "seed": 1},
    }
    assert rules.kind_groups(items, "eta_fixed_tau") == [["a", "b"]]  # c has another seed
    assert rules.kind_groups(items, "lambda") == []  # a and d share λ within 1%
    assert rules.kind_groups(items, "eta_fixed_lambda") == []


def test_probability_best_follows_the_gap_and_the_scale() -> None:
    # Equal predictions: a coin flip; a gap of 2σ_pair: the leader is best ~92% of the time.
    assert rules.probability_best([0.0, 0.0], [0.01, 0.01]) == pytest.approx([0.5, 0.5], abs=0.01)
    sigma_pair = 0.01
    p = rules.probability_best([0.0, 2 * sigma_pair], [sigma_pair / math.sqrt(2)] * 2)
    assert p[0] == pytest.approx(0.977, abs=0.005) and sum(p) == pytest.approx(1.0)
    many = rules.probability_best(list(np.linspace(0, 0.05, 6)), [0.01] * 6)
    assert many[0] == max(many) and many == sorted(many, reverse=True)


def test_compute_fraction_is_token_weighted_and_counts_redone_work() -> None:
    assert rules.compute_fraction({"a": 1.0, "b": 0.1}) == pytest.approx(0.55)
    assert rules.compute_fraction({"a": 1.0, "b": 0.1}, {"a": 3.0, "b": 1.0}) == pytest.approx(3.1 / 4)
    # A trial restarted from scratch after 0.3 (no checkpoint) trained 0.3 twice.
    assert rules.compute_fraction({"a": 1.0}, extra={"a": 0.3}) == pytest.approx(1.3)
    assert rules.compute_fraction({"a": 1.2, "b": -0.1}) == pytest.approx(0.5)  # clipped to [0, 1]


def test_the_cut_is_the_same_in_the_fit_error_and_at_the_rung() -> None:
    # fit() measures e(s) on Curve.head(s); the scheduler predicts from rung_cut: both keep the
    # points up to and including the first at or past s.
    from predictors import Controls, Curve
    from predictors.curves import rung_cut

    t = np.array([0.05, 0.08, 0.11, 0.14, 0.2, 0.31, 1.0])
    curve = Curve(t, 2.0 + (1 - t), Controls(0.3, 20.0))
    for s in (0.1, 0.2, 0.3):
        head_t, _ = curve.head(s)
        pred = rules.predict_at_rung(None, t, curve.loss, None, s)
        assert head_t.size == rung_cut(t, s) == pred.n_points
        assert head_t[-1] >= s - 1e-9 and (head_t.size == 1 or head_t[-2] < s)


def test_keep_rule_ranks_by_the_order_it_is_given():
    # Issue 25: weight 1 ranks by the predicted finals, weight 0 by the losses at the rung
    # (current-best's order); the reasons say which order ranked a trial.
    from hpo.decisions.rules import Candidate, keep_rule

    cands = [Candidate("a", 2.00, 2.40), Candidate("b", 2.10, 2.20), Candidate("c", 2.30, 2.30)]
    by_prediction = keep_rule(cands, last=True, reduction_factor=2, margin=0.0, weight=1.0)
    by_loss = keep_rule(cands, last=True, reduction_factor=2, margin=0.0, weight=0.0)
    assert by_prediction.kept == ("a",) and by_loss.kept == ("b",)
    assert "ranked by losses at the rung" in by_loss.reasons["b"]


def test_keep_rule_within_the_tolerance_keeps_the_rule_survivors_only():
    # Every prediction within the tolerance (loss units here, relative to the best's predicted
    # final): ⌈n/rf⌉ kept though the margin covers everyone; beyond it, the margin shrinks by it.
    from hpo.decisions.rules import Candidate, keep_rule

    cands = [Candidate(str(i), 2.0 + 0.002 * i, 2.3) for i in range(5)]
    assert keep_rule(cands, last=False, reduction_factor=2, margin=0.05).kept_all
    tight = keep_rule(cands, last=False, reduction_factor=2, margin=0.05, tolerance_loss=0.02)
    assert tight.kept == ("0", "1", "2") and not tight.kept_all
    spread = [Candidate(str(i), 2.0 * (1 + 0.01 * i), 2.3) for i in range(5)]
    shrunk = keep_rule(spread, last=True, reduction_factor=2, margin=0.025, tolerance=0.01)
    assert shrunk.kept == ("0", "1") and shrunk.margin == pytest.approx(0.015)


# Asserts: replicates with nearby seed numbers (201, 202) are separate sweeps: a seed is a name,
# not a magnitude within 1% (pooling them put seed noise into the measured order error).
def test_kind_groups_keep_replicate_seeds_apart() -> None:
    items = {f"{s}{e}": {"eta": e, "batch_size": 2048, "weight_decay": 0.1 * 0.01 / e, "tau": 0.3, "seed": s,
                         "data_seed": s} for s in (201, 202) for e in (0.01, 0.02)}
    assert rules.kind_groups(items, "eta_fixed_tau") == [["2010.01", "2010.02"], ["2020.01", "2020.02"]]
