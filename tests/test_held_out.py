"""Held-out errors (hpo/held_out.py): grouping across scales, the shipped error table, coverage."""

from __future__ import annotations

import numpy as np
import pytest

from hpo import held_out
from predictors import Controls, Curve, Predictor, SurrogateParams
from predictors.schedules import Schedule

TRUTH = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1, m=0.15))
T = np.linspace(0.01, 1.0, 200)


def _curves(tpps=(20.0, 80.0, 200.0), taus=(0.05, 0.2, 0.8), sizes=(1e5,), bend=0.0):
    """Surrogate curves; ``bend`` adds a TPP-dependent early excess the q(TPP) law cannot follow."""
    out = []
    for n in sizes:
        for tpp in tpps:
            for tau in taus:
                c = Controls(tau, tpp, Schedule("linear"), n_params=n)
                ell = TRUTH.normalized_curve(T, c) * (1 + bend * np.sin(np.log(tpp)) ** 2 * (1 - T) ** 2)
                out.append(Curve(T, 1.7 * ell, c, {"n_params": n, "name": f"{n:g}-{tpp:g}-{tau:g}"}))
    return out


def test_leave_one_out_error_small_on_surrogate_curves():
    # On noiseless curves drawn from the surrogate itself, held-out predictions are accurate
    # (< 1% at every decision fraction) and the table says it was measured leave-one-out.
    curves = _curves(tpps=(20.0, 80.0), taus=(0.05, 0.1, 0.2, 0.4, 0.8))
    loo = held_out.leave_one_out(curves, fit_kwargs={"t_min": 0.05, "fit_m": True})
    table = held_out.decision_error_table(loo)
    assert table.source == "leave-one-out"
    assert max(table.rel_error) < 0.01


def test_groups_of_merges_equal_values_and_skips_unknown():
    curves = _curves(tpps=(20.0, 20.1, 80.0), taus=(0.1,))
    assert held_out.groups_of(curves, held_out.SCALE_GROUPINGS["leave-one-TPP-out"]) == [[0, 1], [2]]
    assert held_out.groups_of(curves, lambda c: None) == []


def test_across_scales_holds_out_each_tpp_and_size_the_bank_has():
    # One size → only leave-one-TPP-out; two sizes → both groupings, each group predicted by a
    # refit that never saw it.
    fit_kwargs = {"t_min": 0.05, "fit_m": True}
    one = held_out.across_scales(_curves(taus=(0.2,)), fit_kwargs=fit_kwargs, fractions=(0.2,))
    assert [h.scheme for h in one] == ["leave-one-TPP-out"] and one[0].n_groups == 3
    two = held_out.across_scales(_curves(tpps=(20.0, 80.0), sizes=(1e5, 4e5)), fit_kwargs=fit_kwargs,
                                 fractions=(0.2,), extrapolate=False)
    assert [h.scheme for h in two] == ["leave-one-TPP-out", "leave-one-size-out", "leave-one-τ-out"]
    assert all(np.isfinite(h.predicted).all() for h in two)


def test_decision_error_table_ships_the_larger_cross_scale_error():
    # With a TPP effect the power law cannot follow, holding a TPP out costs more than holding
    # one curve out; the table keeps the leave-one-out RMS in-scale and the larger as cross_scale.
    curves = _curves(bend=0.08)
    kwargs = {"t_min": 0.05, "fit_m": True}
    fractions = (0.1, 0.3)
    loo = held_out.leave_one_out(curves, fit_kwargs=kwargs, fractions=fractions)
    cross = held_out.across_scales(curves, fit_kwargs=kwargs, fractions=fractions, schemes=["leave-one-TPP-out"],
                                   extrapolate=False)
    table = held_out.decision_error_table(loo, cross)
    assert table.source == "leave-one-out" and table.rel_error == pytest.approx(tuple(loo.rms()))
    assert table.cross_scale == pytest.approx(tuple(cross[0].rms()))
    assert table.cross_scale_source == "leave-one-TPP-out (3 groups)"
    assert all(c > e for c, e in zip(table.cross_scale, table.rel_error))


def test_coverage_counts_truths_inside_the_stated_interval():
    # Coverage by hand: σ = pred·sqrt(r² + e²); errors of 1%, 3%, 5% against e = 2% (r = 0).
    h = held_out.HeldOutPredictions("x", (0.1,), np.array([[1.01, 1.03, 1.05]]), np.zeros((1, 3)),
                                    np.ones(3), 3)
    assert h.coverage([0.02], 1.0) == [pytest.approx(1 / 3)]
    assert h.coverage([0.02], 2.0) == [pytest.approx(2 / 3)]
    assert h.coverage([0.06], 1.0) == [1.0]
    table = held_out.coverage_table(h, {"e": [0.02]})
    assert table == {"e": {"0.1": {"1σ": pytest.approx(1 / 3), "2σ": pytest.approx(2 / 3)}}}


def test_ranking_error_is_measured_per_kind_of_sweep_on_held_out_sweeps():
    # τ sweeps at η = 0.01, B = 2048 (λ varies: "lambda" kind) at two TPPs, finals that differ
    # by 2-3% per τ step: the held-out refits order every pair right, so the ranking scale is
    # small and measured on both sweeps; no other kind is in the bank.
    curves = []
    for tpp in (20.0, 80.0):
        for k, tau in enumerate((0.05, 0.2, 0.8)):
            c = Controls(tau, tpp, Schedule("linear"))
            final = 1.7 * (1 + 0.03 * k)
            curves.append(Curve(T, final * TRUTH.normalized_curve(T, c), c,
                                {"name": f"{tpp:g}-{tau:g}", "eta": 0.01, "batch_size": 2048,
                                 "weight_decay": 2048 / (0.01 * tau * 2e6), "seed": 1, "data_seed": 1}))
    table = held_out.ranking_error_table(curves, fit_kwargs={"t_min": 0.05, "fit_m": False}, fractions=(0.2, 0.5))
    assert list(table.kinds) == ["lambda"]
    row = table.kinds["lambda"]
    assert row.n_groups == (2, 2) and row.n_pairs == (6, 6)
    assert all(s < 0.05 for s in row.scale) and all(r < 0.03 for r in row.rms), (row.scale, row.rms)


def test_choose_order_takes_the_losses_where_their_order_is_better() -> None:
    # Issue 25: the blend weight is the largest whose pairs are ordered no worse than by the
    # losses at the rung. Predicted finals that get every pair backwards give w = 0 (the
    # losses); predicted finals that order as well as the losses keep w = 1.
    from hpo.held_out import agreement, choose_order

    d_true = np.array([0.02, 0.05, -0.03, 0.01])
    weights = np.ones(4)
    d_loss = np.array([0.03, 0.04, -0.01, 0.02])  # all four right
    w, share, pred_share, loss_share = choose_order(-d_true, d_loss, d_true, weights)
    assert w == 0.0 and loss_share == 1.0 and pred_share == 0.0 and share == 1.0
    w, share, pred_share, _ = choose_order(d_true * 0.5, d_loss, d_true, weights)
    assert w == 1.0 and share == pred_share == 1.0
    assert agreement(np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.ones(2)) == 0.75  # a tie counts half


def test_seed_noise_is_pooled_over_configs_run_with_several_seeds() -> None:
    # The tolerance's default: the pooled spread of log final over seeds of one config; a bank
    # with no repeated config measures none.
    from hpo.held_out import seed_noise

    def make_curve(tau: float, final: float, seed: int) -> Curve:
        c = Controls(tau, 20.0, Schedule("linear"), n_params=1e5)
        return Curve(T, final * TRUTH.normalized_curve(T, c), c, {"n_params": 1e5, "seed": seed,
                                                                  "name": f"{tau}-{final}-{seed}"})

    curves = [make_curve(0.3 if f < 2.4 else 0.1, f, s) for f, s in ((2.00, 1), (2.04, 2), (2.50, 1))]
    noise, words = seed_noise(curves)
    assert noise == pytest.approx(abs(np.log(2.04 / 2.00)) / np.sqrt(2), rel=1e-6) and "1 configs" in words
    assert seed_noise(curves[:1] + curves[2:]) is None


def test_size_method_falls_back_to_the_simpler_when_the_gain_is_within_noise() -> None:
    # Leave-one-size-out scores per held-out size (N: mean RMS over s ≤ 0.3), simplest method first.
    # The trend's lower mean comes from one size's luck (it loses at another): within noise,
    # so the simpler method is shipped, and the rule says why.
    lucky = {"reference curves": {1e4: 0.050, 1e5: 0.006, 1e6: 0.007, 4e6: 0.008},
             "surrogate": {1e4: 0.050, 1e5: 0.005, 1e6: 0.006, 4e6: 0.007},
             "size term": {1e4: 0.004, 1e5: 0.012, 1e6: 0.006, 4e6: 0.007}}
    name, why = held_out.pick_within_noise(lucky)
    assert name == "reference curves" and "within 2 standard errors" in why and "size term scored lower" in why
    # The same mean gain, won at every size by about the same margin: the complex method.
    steady = {"reference curves": {1e4: 0.020, 1e5: 0.021, 1e6: 0.019, 4e6: 0.020},
              "surrogate": {1e4: 0.020, 1e5: 0.021, 1e6: 0.019, 4e6: 0.020},
              "size term": {1e4: 0.005, 1e5: 0.005, 1e6: 0.004, 4e6: 0.006}}
    assert held_out.pick_within_noise(steady)[0] == "size term"
    # A gain over the surrogate but not over the nearer simpler method: that simpler method.
    middle = {"reference curves": {1e4: 0.030, 1e5: 0.031, 1e6: 0.029},
              "surrogate": {1e4: 0.010, 1e5: 0.011, 1e6: 0.009},
              "size term": {1e4: 0.002, 1e5: 0.016, 1e6: 0.003}}
    assert held_out.pick_within_noise(middle)[0] == "surrogate"
    # One size in common: the noise is unknown and the simplest stands.
    assert held_out.pick_within_noise({"reference curves": {1e5: 0.02}, "size term": {1e5: 0.001}})[0] == (
        "reference curves")
