"""Alignment (paper §5 step 5): Predictor.predict_final/predict_curve, align_divisor, collapse_residuals."""

import math

import numpy as np
import pytest

from predictors import (
    AlignSettings,
    Controls,
    Curve,
    DecisionError,
    Predictor,
    SurrogateParams,
    align_divisor,
    collapse_residuals,
    smooth_loss,
)
from predictors.schedules import Schedule

TRUE = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.1)
PRED = Predictor(TRUE)
T = np.linspace(0.001, 1.0, 2000)
CASES = [
    Controls(tau, tpp, Schedule(name))
    for tau in (0.03, 0.2, 1.0)
    for tpp in (20.0, 200.0)
    for name in ("linear", "cosine", "wsd")
]


def run(controls, final=2.0, noise=0.0, seed=0):
    y = final * PRED.normalized_curve(T, controls)
    if noise:
        y = y * (1.0 + np.random.default_rng(seed).normal(0.0, noise, T.size))
    return y


@pytest.mark.parametrize("s", [0.1, 0.2, 0.3])
def test_noiseless_curves_give_the_final_loss_within_half_a_percent(s):
    # From the first 10–30% of a noiseless surrogate curve the predicted final is within 0.5% (here ~exact).
    for c in CASES:
        y = run(c)
        n = np.searchsorted(T, s, side="right")
        p = PRED.predict_final(T[:n], y[:n], c)
        assert p.final_loss == pytest.approx(2.0, rel=5e-3)
        assert p.stop_fraction == pytest.approx(T[n - 1]) and p.n_points >= 3
        assert p.segment_start >= 0.8 * s - 1e-3 and p.residual < 1e-9


@pytest.mark.parametrize("objective", ["log", "l2", "l1"])
def test_noisy_curves_give_the_final_within_the_noise_level(objective):
    # With 1% per-point noise, the RMS error of the predicted final over many runs is below 1%.
    pred = Predictor(TRUE, align=AlignSettings(objective=objective))
    errs = []
    for i, c in enumerate(CASES):
        y = run(c, noise=0.01, seed=i)
        for s in (0.1, 0.2, 0.3):
            n = np.searchsorted(T, s, side="right")
            errs.append(pred.predict_final(T[:n], y[:n], c).final_loss / 2.0 - 1.0)
    assert math.sqrt(np.mean(np.square(errs))) < 0.01


def test_smoothed_curves_with_lag_matching():
    # A 2%-of-training trailing mean biases the s = 0.1 prediction; smoothing_window removes most of it.
    c = Controls(0.05, 20.0)
    y = smooth_loss(T, run(c), window_tokens=0.02)
    n = np.searchsorted(T, 0.1, side="right")
    plain = PRED.predict_final(T[:n], y[:n], c).final_loss / 2.0 - 1.0
    matched = PRED.predict_final(T[:n], y[:n], c, smoothing_window=0.02).final_loss / 2.0 - 1.0
    assert abs(matched) < 0.002 < abs(plain)


def test_align_divisor_objectives():
    # Each objective returns the exact scale for proportional input; L1 is the weighted median solution.
    ell = np.array([1.3, 1.2, 1.1, 1.05])
    for obj in ("log", "l2", "l1"):
        assert align_divisor(2.5 * ell, ell, obj) == pytest.approx(2.5)
    loss = 2.0 * ell * np.array([1.0, 1.02, 0.97, 1.01])
    cs = np.linspace(1.8, 2.2, 40001)
    brute = cs[np.argmin([np.abs(loss / c - ell).sum() for c in cs])]
    assert align_divisor(loss, ell, "l1") == pytest.approx(brute, abs=2e-5)
    l2 = cs[np.argmin([np.square(loss / c - ell).sum() for c in cs])]
    assert align_divisor(loss, ell, "l2") == pytest.approx(l2, abs=2e-5)
    with pytest.raises(ValueError, match="objective"):
        align_divisor(loss, ell, "l3")


def test_segment_override_and_minimum_points():
    # segment=(a, b) aligns on exactly those points; a short default window is extended to min_points.
    c = Controls(0.2, 20.0)
    t = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3])
    y = 2.0 * PRED.normalized_curve(t, c)
    p = PRED.predict_final(t, y, c, segment=(0.1, 0.2))
    assert (p.segment_start, p.stop_fraction, p.n_points) == (0.1, 0.2, 3)
    p = PRED.predict_final(t, y, c)  # [0.24, 0.3] holds 2 points → extended to 3
    assert p.n_points == 3 and p.segment_start == 0.2
    with pytest.raises(ValueError, match="holds 1 points"):
        PRED.predict_final(t, y, c, segment=(0.29, 0.3))
    with pytest.raises(ValueError, match="start"):
        PRED.predict_final(t, y, c, segment=(0.3, 0.1))


def test_uncertainty_combines_residual_and_calibrated_error():
    # σ = L̂·sqrt(residual² + e(s)²), e(s) interpolated from decision_error and clamped outside it.
    de = DecisionError((0.1, 0.3), (0.04, 0.02))
    pred = Predictor(TRUE, decision_error=de)
    c = Controls(0.2, 20.0)
    y = run(c, noise=0.01, seed=3)
    n = np.searchsorted(T, 0.2, side="right")
    p = pred.predict_final(T[:n], y[:n], c)
    e = np.interp(p.stop_fraction, [0.1, 0.3], [0.04, 0.02])
    assert p.uncertainty == pytest.approx(p.final_loss * math.hypot(p.residual, e))
    assert p.residual > 0 and p.uncertainty > 0
    assert de.at(0.05) == 0.04 and de.at(0.9) == 0.02
    # Uncalibrated: only the residual scale.
    q = PRED.predict_final(T[:n], y[:n], c)
    assert q.uncertainty == pytest.approx(q.final_loss * q.residual)


@pytest.mark.parametrize(
    "t, y, match",
    [
        (np.array([0.1, 0.2, 0.3]), np.array([2.0, np.nan, 2.0]), "non-finite"),
        (np.array([0.1, 0.2, 0.3]), np.array([2.0, np.inf, 2.0]), "non-finite"),
        (np.array([0.1, 0.3, 0.2]), np.array([2.0, 2.0, 2.0]), "strictly increasing"),
        (np.array([0.1, 0.2, 1.3]), np.array([2.0, 2.0, 2.0]), r"\[0, 1\]"),
        (np.array([0.1, 0.2]), np.array([2.0, 2.0]), "at least 3"),
        (np.array([0.1, 0.2, 0.3]), np.array([2.0, 0.0, 2.0]), "> 0"),
    ],
)
def test_predict_final_rejects_bad_input(t, y, match):
    # NaN/inf losses, bad t̂, too few points and non-positive losses raise ValueError (no silent number).
    with pytest.raises(ValueError, match=match):
        PRED.predict_final(t, y, Controls(0.2, 20.0))


def test_predict_final_rejects_non_controls():
    # The controls argument must be a Controls (τ, TPP > 0 are checked there).
    with pytest.raises(ValueError, match="Controls"):
        PRED.predict_final([0.1, 0.2, 0.3], [2, 2, 2], {"tau": 0.2})  # type: ignore[arg-type]


def test_predict_curve_is_final_times_surrogate():
    # predict_curve returns L(T)·ℓ̂ at t_out (default 101 points on [0, 1]).
    c = Controls(0.2, 80.0, Schedule("cosine"))
    y = run(c, final=3.0)
    n = np.searchsorted(T, 0.3, side="right")
    full = PRED.predict_curve(T[:n], y[:n], c)
    assert full.shape == (101,) and full[-1] == pytest.approx(3.0, rel=1e-9)
    np.testing.assert_allclose(PRED.predict_curve(T[:n], y[:n], c, t_out=T), y, rtol=1e-9)


def test_collapse_residuals_against_predictor_and_curve():
    # A run that follows the reference has ~0 residuals and its early-align divisor is its final loss;
    # a deviating run shows the deviation; a Curve or (t̂, ℓ) pair also works as the reference.
    c = Controls(0.2, 20.0)
    y = run(c, final=2.0)
    r = collapse_residuals(T, y, PRED, c)
    assert r.final_loss == pytest.approx(2.0) and np.max(np.abs(r.residual)) < 1e-12
    assert r.window == (0.25, 0.5)
    bumped = y * (1.0 + 0.02 * (T > 0.7))
    r = collapse_residuals(T, bumped, PRED, c)
    assert r.residual[T > 0.7].mean() == pytest.approx(0.02 * PRED.normalized_curve(T[T > 0.7], c).mean(), rel=1e-3)
    t_ref = np.linspace(0.001, 1.0, 700)  # a coarser reference grid, ending at t̂ = 1
    ref_curve = Curve(t_ref, 5.0 * PRED.normalized_curve(t_ref, c), c)
    r2 = collapse_residuals(T, y, ref_curve)
    assert r2.final_loss == pytest.approx(2.0, rel=1e-5)
    # (linear interpolation of the coarser reference costs a little near t̂ = 0 and at the warmup kink)
    assert np.median(np.abs(r2.residual)) < 1e-5 and np.max(np.abs(r2.residual[r2.t_hat > 0.05])) < 5e-3
    r3 = collapse_residuals(T, y, (t_ref, PRED.normalized_curve(t_ref, c)))
    np.testing.assert_allclose(r3.residual, r2.residual, atol=1e-12)


def test_collapse_residuals_bad_input():
    # No controls with a Predictor reference, a run short of the window, or NaN losses → ValueError.
    c = Controls(0.2, 20.0)
    y = run(c)
    with pytest.raises(ValueError, match="controls"):
        collapse_residuals(T, y, PRED)
    n = np.searchsorted(T, 0.2)
    with pytest.raises(ValueError, match="alignment window"):
        collapse_residuals(T[:n], y[:n], PRED, c)
    bad = y.copy()
    bad[10] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        collapse_residuals(T, bad, PRED, c)
    with pytest.raises(ValueError, match="reference"):
        collapse_residuals(T, y, 3.0)
