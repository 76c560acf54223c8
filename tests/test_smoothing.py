"""The token-weighted trailing mean and the one definition of the final loss (predictors/smoothing.py)."""

import numpy as np
import pytest

from predictors.smoothing import FINISHED_T_HAT, TrailingMean, final_loss, trailing_mean


def test_online_smoother_matches_the_offline_one() -> None:
    # The trainer's live smoother and the calibration's offline one give the same curve.
    rng = np.random.default_rng(0)
    tokens = np.cumsum(rng.integers(1, 20, size=300)) * 64.0
    loss = rng.normal(2.0, 0.1, size=300)
    online = TrailingMean(2_000.0)
    live = [online.update(t, v) for t, v in zip(tokens, loss)]
    np.testing.assert_allclose(live, trailing_mean(tokens, loss, 2_000.0), rtol=1e-12)


def test_a_short_last_interval_weighs_by_its_tokens() -> None:
    # Three 10-step intervals at loss 2.0, then a 1-step interval at 3.0 (a run whose step
    # count is not a multiple of log_every): the final smoothed loss moves by 1/31 of the
    # jump, not by 1/4 as an equal-weight mean of interval means would.
    tokens = np.array([10.0, 20.0, 30.0, 31.0]) * 100
    loss = np.array([2.0, 2.0, 2.0, 3.0])
    smoothed = trailing_mean(tokens, loss, window_tokens=31 * 100)
    assert smoothed[-1] == pytest.approx(2.0 + 1.0 / 31.0)


def test_an_interval_partly_inside_the_window_counts_by_its_tokens_inside() -> None:
    # Window 15 tokens at the end of (0, 10] at 1.0 and (10, 20] at 3.0: 5 tokens at 1, 10 at 3.
    smoothed = trailing_mean([10.0, 20.0], [1.0, 3.0], window_tokens=15.0)
    assert smoothed[-1] == pytest.approx((5 * 1.0 + 10 * 3.0) / 15.0)
    # Before the window is full, everything so far is averaged.
    assert smoothed[0] == pytest.approx(1.0)


def test_zero_window_returns_the_values() -> None:
    np.testing.assert_array_equal(trailing_mean([1.0, 2.0], [5.0, 6.0], 0.0), [5.0, 6.0])


def test_final_loss_needs_a_finished_curve() -> None:
    # The final loss is the smoothed value at t̂ = 1; a curve that stops earlier has none.
    assert final_loss([0.5, 1.0], [2.5, 2.0]) == 2.0
    assert final_loss([0.5, 0.9], [2.5, 2.1]) is None
    assert final_loss([0.5, FINISHED_T_HAT], [2.5, 2.1]) == 2.1
    # A NaN at the end (a divergence) leaves the last finite point, which is not at t̂ = 1.
    assert final_loss([0.5, 1.0], [2.5, float("nan")]) is None
