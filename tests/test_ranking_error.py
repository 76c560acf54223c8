"""The ranking error (hpo/calibration/ranking_error.py): held-out sweeps per kind, the order used, the seed noise."""

from __future__ import annotations

import numpy as np
import pytest

from hpo.calibration.ranking_error import (agreement, choose_order, evaluation_groups, ranking_error_table, seed_noise,
                                          swept_sizes)
from predictors import Controls, Curve, Predictor, SurrogateParams
from predictors.schedules import Schedule

TRUTH = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1, m=0.15))
T = np.linspace(0.01, 1.0, 200)


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
    table = ranking_error_table(curves, fit_kwargs={"t_min": 0.05, "fit_m": False}, fractions=(0.2, 0.5))
    assert list(table.kinds) == ["lambda"]
    row = table.kinds["lambda"]
    assert row.n_groups == (2, 2) and row.n_pairs == (6, 6)
    assert all(s < 0.05 for s in row.scale) and all(r < 0.03 for r in row.rms), (row.scale, row.rms)


def test_choose_order_takes_the_losses_where_their_order_is_better() -> None:
    # Issue 25: the blend weight is the largest whose pairs are ordered no worse than by the
    # losses at the rung. Predicted finals that get every pair backwards give w = 0 (the
    # losses); predicted finals that order as well as the losses keep w = 1.
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
    def make_curve(tau: float, final: float, seed: int) -> Curve:
        c = Controls(tau, 20.0, Schedule("linear"), n_params=1e5)
        return Curve(T, final * TRUTH.normalized_curve(T, c), c, {"n_params": 1e5, "seed": seed,
                                                                  "name": f"{tau}-{final}-{seed}"})

    curves = [make_curve(0.3 if f < 2.4 else 0.1, f, s) for f, s in ((2.00, 1), (2.04, 2), (2.50, 1))]
    noise, words = seed_noise(curves)
    assert noise == pytest.approx(abs(np.log(2.04 / 2.00)) / np.sqrt(2), rel=1e-6) and "1 configs" in words
    assert seed_noise(curves[:1] + curves[2:]) is None


def _sweep_curve(tau: float, tpp: float, n: float, final: float) -> Curve:
    c = Controls(tau, tpp, Schedule("linear"), n_params=n)
    return Curve(T, final * TRUTH.normalized_curve(T, c), c,
                 {"name": f"{n:g}-{tpp:g}-{tau:g}", "eta": 0.01, "batch_size": 2048, "n_params": n,
                  "weight_decay": 2048 / (0.01 * tau * tpp * n), "seed": 1, "data_seed": 1})


def test_a_sweep_at_a_size_calibrated_without_sweeps_is_evidence_off_in_size_not_in_tpp() -> None:
    # Issue 28: a bank swept at 0.1M (TPP 20, 80) pooled with a width-ladder run at 0.39M (one τ,
    # no sweep) calibrates 0.39M's loss, not a sweep's order there. A λ sweep at 0.39M, TPP 10
    # (a ranking bank) is placed off in size (beyond the swept 0.1M), not on the TPP axis where
    # it would set the margin of sweeps at 0.1M below TPP 20; with one calibrated size the two
    # rules agree.
    bank = [_sweep_curve(tau, tpp, 1e5, 1.7 * (1 + 0.03 * k)) for tpp in (20.0, 80.0)
            for k, tau in enumerate((0.05, 0.2, 0.8))]
    bank.append(_sweep_curve(0.4, 20.0, 3.9e5, 1.4))
    assert swept_sizes(bank) == (1e5,)
    pooled = Predictor(TRUTH.params, provenance={"tokens_per_param": [20.0, 80.0], "model_sizes": [1e5, 3.9e5]})
    transfer = [_sweep_curve(tau, 10.0, 3.9e5, 1.5 * (1 + 0.03 * k)) for k, tau in enumerate((0.1, 0.4, 1.6))]
    (group,) = evaluation_groups(pooled, transfer, fractions=(0.2, 0.5), swept=swept_sizes(bank))
    assert (group.value, group.position.axis, group.position.inside) == (3.9e5, "n_params", False)
    assert group.position.distance == pytest.approx(np.log(3.9), rel=1e-9) and "lambda" in group.kinds
    (before,) = evaluation_groups(pooled, transfer, fractions=(0.2, 0.5))
    assert (before.value, before.position.axis) == (10.0, "tokens_per_param")
    shipped = Predictor(TRUTH.params, provenance={"tokens_per_param": [20.0, 80.0], "model_sizes": [1e5]})
    (a,) = evaluation_groups(shipped, transfer, fractions=(0.2, 0.5), swept=(1e5,))
    (b,) = evaluation_groups(shipped, transfer, fractions=(0.2, 0.5))
    assert a == b
