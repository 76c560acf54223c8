"""The noisy quadratic model (predictors/nqm.py, equations.nqm_expected_loss): Eq. 15 and App. B.3."""

import numpy as np
import pytest

from predictors import equations
from predictors.nqm import nqm_expected_loss_schedule, nqm_sample_loss
from predictors.schedules import Schedule

T = np.array([0.05, 0.1, 0.3, 0.5, 0.8, 1.0])
CONST = Schedule("constant", warmup_fraction=0.0)
KW = dict(noise_var=0.02, theta0_sq=1.0, steps=4000)


def test_constant_lr_matches_closed_form_eq15():
    # Under a constant LR the discrete moment recursion matches the paper's Eq. 15 to 0.5%.
    for tau in (0.05, 0.2, 1.0):
        sim = nqm_expected_loss_schedule(T, tau, CONST, curvature=2.0, **KW)
        closed = equations.nqm_expected_loss(T, tau, curvature=2.0, noise_var=0.02, theta0_sq=1.0)
        np.testing.assert_allclose(sim, closed, rtol=5e-3)


def test_eq16_no_initial_bias_is_a_pure_variance_ramp():
    # With E[θ(0)²] = 0 (Eq. 16) the loss rises monotonically to the floor hσ²/(4τ).
    closed = equations.nqm_expected_loss(np.linspace(0, 5, 50), 0.5, 1.0, 1.0, 0.0)
    assert closed[0] == 0.0 and np.all(np.diff(closed) > 0)
    assert closed[-1] == pytest.approx(1.0 / (4 * 0.5), rel=1e-3)


def test_constant_lr_small_tau_is_lower_early_and_higher_late():
    # Constant LR (App. B.3): small τ removes the bias faster (lower early) but has a higher floor.
    small, large = nqm_expected_loss_schedule(T, [0.05, 0.5], CONST, **KW)
    assert small[1] < large[1]  # t̂ = 0.1
    assert small[-1] > large[-1]  # t̂ = 1


def test_decay_to_zero_inverts_the_ordering_across_tau():
    # Under D2Z the small-τ run has the larger late drop: its normalised curve lies above the
    # large-τ one mid-training and its final loss is lower: both orderings invert vs constant LR.
    c_small, c_large = nqm_expected_loss_schedule(T, [0.05, 0.5], Schedule("constant"), **KW)
    d_small, d_large = nqm_expected_loss_schedule(T, [0.05, 0.5], Schedule("linear"), **KW)
    mid = 3  # t̂ = 0.5
    assert c_small[mid] / c_small[-1] < c_large[mid] / c_large[-1]
    assert d_small[mid] / d_small[-1] > d_large[mid] / d_large[-1]
    assert c_small[-1] > c_large[-1] and d_small[-1] < d_large[-1]
    drop = lambda y: (y[mid] - y[-1]) / y[mid]  # noqa: E731
    assert drop(d_small) > drop(d_large)


def test_more_decay_gives_a_bigger_final_drop():
    # At small τ: constant < 10× decay < D2Z in the drop from t̂ = 0.5 to the end, and the reverse
    # order in the final loss (Fig. 10; at large τ the pure NQM's slow bias removal blurs this).
    drops, finals = [], []
    for name in ("constant", "linear_10x", "linear"):
        y = nqm_expected_loss_schedule(T, 0.05, Schedule(name), **KW)
        drops.append((y[3] - y[-1]) / y[3])
        finals.append(y[-1])
    assert drops[0] < drops[1] < drops[2]
    assert finals[0] > finals[1] > finals[2]


def test_sampled_curve_averages_to_the_expectation():
    # A Monte-Carlo run with many coordinates matches the expected loss within its noise.
    rng = np.random.default_rng(0)
    y = nqm_sample_loss(T, 0.2, CONST, noise_var=0.02, theta0_sq=1.0, steps=2000, dims=4096, rng=rng)
    e = nqm_expected_loss_schedule(T, 0.2, CONST, noise_var=0.02, theta0_sq=1.0, steps=2000)
    np.testing.assert_allclose(y, e, rtol=0.1)


def test_nqm_rejects_bad_tau():
    # τ ≤ 0 or τ·steps ≤ 1 (α ≥ 1) is a ValueError.
    with pytest.raises(ValueError, match="tau"):
        nqm_expected_loss_schedule(T, 0.0)
    with pytest.raises(ValueError, match="α < 1"):
        nqm_expected_loss_schedule(T, 1e-4, steps=1000)
