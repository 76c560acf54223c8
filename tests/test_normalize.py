"""Normalisation helpers and the Curve container (predictors/normalize.py, predictors/curves.py)."""

import numpy as np
import pytest

from predictors import Controls, Curve, drop_nonfinite, normalize_loss, smooth_loss, training_fraction_of
from predictors.normalize import check_curve, window_tokens_of
from predictors.smoothing import trailing_mean
from predictors.schedules import Schedule

CTRL = Controls(0.2, 20.0, Schedule())


def test_window_in_sequences_equals_window_in_tokens():
    # A window of 8 sequences × 64 tokens smooths exactly like a window of 512 tokens (trailing_mean).
    tokens = np.arange(1, 201) * 128.0
    loss = 3.0 + np.sin(tokens / 500.0)
    a = smooth_loss(tokens, loss, window_sequences=8, seq_len=64)
    b = smooth_loss(tokens, loss, window_tokens=512)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, trailing_mean(tokens, loss, 512.0))


def test_window_needs_exactly_one_unit():
    # Giving both or neither window unit, or sequences without seq_len, is a ValueError.
    with pytest.raises(ValueError, match="exactly one"):
        window_tokens_of(window_tokens=1.0, window_sequences=1.0, seq_len=4)
    with pytest.raises(ValueError, match="exactly one"):
        window_tokens_of()
    with pytest.raises(ValueError, match="seq_len"):
        window_tokens_of(window_sequences=3)


def test_smoothing_rejects_nonfinite_loss():
    # smooth_loss raises on NaN instead of spreading it through the window.
    with pytest.raises(ValueError, match="finite"):
        smooth_loss([1.0, 2.0, 3.0], [1.0, np.nan, 1.0], window_tokens=2.0)


def test_training_fraction_and_range_check():
    # t̂ = tokens/total lies in [0, 1]; a token count beyond the total is an error.
    t = training_fraction_of([0, 50, 100], 100)
    np.testing.assert_allclose(t, [0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        training_fraction_of([0, 50, 101], 100)
    with pytest.raises(ValueError, match="total_tokens"):
        training_fraction_of([0, 1], 0)


def test_normalize_loss_divides_by_final():
    # ℓ = L/L(1): the last point becomes 1; an explicit final loss is honoured.
    ell = normalize_loss([4.0, 3.0, 2.0])
    np.testing.assert_allclose(ell, [2.0, 1.5, 1.0])
    np.testing.assert_allclose(normalize_loss([4.0, 2.0], final_loss=4.0), [1.0, 0.5])
    with pytest.raises(ValueError):
        normalize_loss([1.0, np.inf])


@pytest.mark.parametrize(
    "t, y, match",
    [
        ([0.1, 0.2, 0.2], [1.0, 1.0, 1.0], "strictly increasing"),
        ([0.3, 0.2, 0.4], [1.0, 1.0, 1.0], "strictly increasing"),
        ([0.1, 0.5, 1.2], [1.0, 1.0, 1.0], r"\[0, 1\]"),
        ([-0.1, 0.5, 0.9], [1.0, 1.0, 1.0], r"\[0, 1\]"),
        ([0.1], [1.0], "at least 2"),
        ([0.1, 0.2, 0.3], [1.0, np.nan, 1.0], "non-finite"),
        ([0.1, 0.2, 0.3], [1.0, np.inf, 1.0], "non-finite"),
        ([0.1, 0.2, 0.3], [1.0, -1.0, 1.0], "> 0"),
        ([0.1, 0.2], [1.0, 1.0, 1.0], "one length"),
    ],
)
def test_check_curve_rejects_bad_input(t, y, match):
    # Each malformed curve gives a ValueError that says what is wrong.
    with pytest.raises(ValueError, match=match):
        check_curve(t, y)


def test_drop_nonfinite_is_the_explicit_skip():
    # drop_nonfinite removes NaN/inf points and keeps the rest in order.
    t, y = drop_nonfinite([0.1, 0.2, 0.3, 0.4], [1.0, np.nan, 2.0, np.inf])
    np.testing.assert_array_equal(t, [0.1, 0.3])
    np.testing.assert_array_equal(y, [1.0, 2.0])


def test_curve_validates_and_is_read_only():
    # Curve converts to float arrays, validates, freezes them, and exposes ℓ and the head.
    c = Curve([0.0, 0.5, 1.0], [3, 2, 1.5], CTRL, {"name": "x"})
    assert c.final_loss == 1.5
    np.testing.assert_allclose(c.normalized, [2.0, 4 / 3, 1.0])
    t, y = c.head(0.5)
    np.testing.assert_array_equal(t, [0.0, 0.5])
    with pytest.raises(ValueError):
        c.loss[0] = 1.0
    with pytest.raises(ValueError, match="non-finite"):
        Curve([0.0, 0.5, 1.0], [3, np.nan, 1.5], CTRL)
    with pytest.raises(ValueError, match="Controls"):
        Curve([0.0, 1.0], [3, 1.5], {"tau": 1})  # type: ignore[arg-type]


def test_controls_reject_nonpositive_tau_and_tpp():
    # τ ≤ 0 or TPP ≤ 0 is a ValueError at construction.
    with pytest.raises(ValueError, match="tau"):
        Controls(0.0, 20.0)
    with pytest.raises(ValueError, match="tokens_per_param"):
        Controls(0.2, -1.0)


def test_curve_from_tokens_smooths_and_normalises_time():
    # Curve.from_tokens smooths over the token window and maps tokens to t̂.
    tokens = np.arange(1, 101) * 10.0
    loss = np.linspace(3.0, 2.0, 100)
    c = Curve.from_tokens(tokens, loss, 1000.0, CTRL, window_sequences=2, seq_len=10)
    np.testing.assert_allclose(c.t_hat, tokens / 1000.0)
    np.testing.assert_allclose(c.loss, trailing_mean(tokens, loss, 20.0))
