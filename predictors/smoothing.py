"""Trailing moving averages over a window measured in tokens.

The paper smooths with a moving average over a fixed amount of data (100 steps for plots,
12,288 sequences for fitting; App. D.1). A window in *tokens* means runs with different
batch sizes are smoothed over the same amount of data. The window is trailing (causal)
so that the value at t̂ uses only what a live trial has already reported: the scheduler,
the trainer and the calibration all smooth the same way.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


def trailing_mean(tokens: Any, values: Any, window_tokens: float) -> np.ndarray:
    """Mean of ``values`` over points whose token count lies in (tokens_i − window, tokens_i].

    ``tokens`` must be non-decreasing. A window ≤ 0 returns the values unchanged.
    """
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("trailing_mean: tokens and values must be 1-D arrays of one length")
    if window_tokens <= 0 or len(y) == 0:
        return y.copy()
    if np.any(np.diff(x) < 0):
        raise ValueError("trailing_mean: tokens must be non-decreasing")
    csum = np.concatenate([[0.0], np.cumsum(y)])
    # First index inside each point's window.
    start = np.searchsorted(x, x - window_tokens, side="right")
    end = np.arange(1, len(y) + 1)
    return (csum[end] - csum[start]) / (end - start)


class TrailingMean:
    """Online version of :func:`trailing_mean` for a live run (one value per log step)."""

    def __init__(self, window_tokens: float) -> None:
        self.window_tokens = float(window_tokens)
        self._points: deque[tuple[float, float]] = deque()
        self._sum = 0.0

    def update(self, tokens: float, value: float) -> float:
        self._points.append((float(tokens), float(value)))
        self._sum += float(value)
        while len(self._points) > 1 and self._points[0][0] <= tokens - self.window_tokens:
            self._sum -= self._points.popleft()[1]
        return self._sum / len(self._points)

    def state_dict(self) -> dict[str, Any]:
        # The running sum is saved as is: recomputing it could differ in the last bit and
        # break exact resume.
        return {"window_tokens": self.window_tokens, "points": [list(p) for p in self._points],
                "sum": self._sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window_tokens = float(state["window_tokens"])
        self._points = deque((float(a), float(b)) for a, b in state["points"])
        self._sum = float(state["sum"]) if "sum" in state else sum(v for _, v in self._points)
