"""Trailing moving averages over a window measured in tokens, weighted by tokens.

The paper smooths with a moving average over a fixed amount of data (100 steps for plots,
§3; 12,288 sequences for fitting, App. D.1). A window in *tokens* means runs with different
batch sizes are smoothed over the same amount of data. The window is trailing (causal)
so that the value at t̂ uses only what a live trial has already reported: the scheduler,
the trainer and the calibration all smooth the same way.

Each logged value is the mean loss of the interval that ends at its token count (the
trainer logs the mean over ``log_every`` steps; a per-step log is an interval of one
step), so the smoothed value is the exact token-weighted mean of that piecewise-constant
loss over the last ``window_tokens`` tokens: an interval counts by the tokens it covers
inside the window. Counting intervals instead of tokens let a run's short last interval
(491 steps logged every 10 leave a 1-step interval) weigh as much as a full one, so the
final smoothed loss, which every normalisation and regret divides by, leaned on one batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


def _window_means(starts: np.ndarray, ends: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """Token-weighted mean of the piecewise-constant loss (``values[k]`` on
    (``starts[k]``, ``ends[k]``]) over (end_i − window, end_i], for every i."""
    # C(x): integral of the loss over tokens up to x; piecewise linear between boundaries.
    boundaries = np.concatenate([starts[:1], ends])
    integral = np.concatenate([[0.0], np.cumsum(values * (ends - starts))])
    lower = np.maximum(ends - window, starts[0])
    width = ends - lower
    mass = integral[1:] - np.interp(lower, boundaries, integral)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = mass / width
    # A point with no tokens in its window (a repeated token count) keeps its own value.
    return np.where(width > 0, out, values)


def trailing_mean(tokens: Any, values: Any, window_tokens: float) -> np.ndarray:
    """Token-weighted mean of ``values`` over the last ``window_tokens`` tokens at each point.

    Point i stands for the interval (tokens[i−1], tokens[i]] (the first for (0, tokens[0]]);
    an interval partly inside the window counts by its tokens inside. ``tokens`` must be
    non-decreasing. A window ≤ 0 returns the values unchanged.
    """
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("trailing_mean: tokens and values must be 1-D arrays of one length")
    if window_tokens <= 0 or len(y) == 0:
        return y.copy()
    if np.any(np.diff(x) < 0):
        raise ValueError("trailing_mean: tokens must be non-decreasing")
    starts = np.concatenate([[min(0.0, float(x[0]))], x[:-1]])
    return _window_means(starts, x, y, float(window_tokens))


#: What "final loss" means everywhere in this project (normalisation ℓ = L/L(T), regret, the
#: decision and ranking errors, the report): the smoothed training loss at the run's last
#: point, i.e. the token-weighted mean training loss over the last smoothing window of
#: training (2% of the tokens by default).
FINAL_LOSS_DEFINITION = (
    "final loss = the smoothed training loss at t̂ = 1: the token-weighted mean training loss "
    "over the last smoothing window (2% of the run's tokens by default)"
)
#: A run counts as finished when its last point reaches at least this t̂.
FINISHED_T_HAT = 1.0 - 1e-6


def final_loss(t_hat: Any, smoothed_loss: Any) -> float | None:
    """The final loss (:data:`FINAL_LOSS_DEFINITION`) of a smoothed curve, or None when the
    curve has no finite point at t̂ ≥ :data:`FINISHED_T_HAT` (a stopped, running or diverged
    run has no final loss)."""
    t = np.asarray(t_hat, dtype=np.float64)
    y = np.asarray(smoothed_loss, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(y)
    if not ok.any():
        return None
    last = int(np.flatnonzero(ok)[-1])
    if t[last] < FINISHED_T_HAT:
        return None
    return float(y[last])


class TrailingMean:
    """Online version of :func:`trailing_mean` for a live run (one value per log interval).

    ``update(tokens, value)`` takes the token count at the end of the interval and the
    interval's mean loss; it returns the same value :func:`trailing_mean` gives for that
    point (to float rounding: it sums only the intervals still inside the window).
    """

    def __init__(self, window_tokens: float) -> None:
        self.window_tokens = float(window_tokens)
        self._intervals: deque[tuple[float, float, float]] = deque()  # (start, end, value)
        self._end = 0.0

    def update(self, tokens: float, value: float) -> float:
        end, value = float(tokens), float(value)
        # The first interval starts at 0 (tokens are counted from the start of training).
        start = self._end if self._intervals else min(0.0, end)
        self._intervals.append((start, end, value))
        self._end = end
        if self.window_tokens <= 0:
            return value
        # Drop intervals wholly before the window (keep at least the newest one).
        while len(self._intervals) > 1 and self._intervals[0][1] <= end - self.window_tokens:
            self._intervals.popleft()
        starts, ends, values = (np.array(col, dtype=np.float64) for col in zip(*self._intervals))
        return float(_window_means(starts, ends, values, self.window_tokens)[-1])
