"""Normalisation of loss curves: smoothing, training fraction, ℓ(t̂) = L(t̂)/L(1).

Paper §2 (Eq. 1) and §3: the collapse uses ℓ(t̂) = L(t̂T)/L(T) (Eq. 1 with L̂ = 0) after a moving
average; for fitting the predictor the paper smooths over 12,288 sequences (App. D.1; see
docs/paper.md). We smooth
with the project's one trailing token-window mean (``predictors.smoothing.trailing_mean``) so a
curve looks the same to the trainer, the scheduler and the calibration.

Bad input policy (one per function, see docs/predictor.md):

* :func:`check_curve`, :func:`smooth_loss`, :func:`normalize_loss`, :func:`training_fraction_of`
  raise ``ValueError`` on NaN/inf, too few points, non-increasing or out-of-range t̂.
* :func:`drop_nonfinite` is the one *explicit* skip: it returns the points whose loss is finite,
  for callers that want to ignore isolated bad log entries instead of failing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from predictors import equations
from predictors.smoothing import trailing_mean

# Rounding slack for t̂ = tokens/total_tokens at the ends of [0, 1]; values inside the slack are
# clipped, values beyond it are an error.
T_HAT_SLACK = 1e-9


def check_t_hat(t_hat: Any, *, name: str = "t_hat", increasing: bool = True) -> np.ndarray:
    """Return ``t_hat`` as a float array after checking it is 1-D, finite and inside [0, 1].

    With ``increasing`` (default) it must also be strictly increasing. Raises ``ValueError``.
    """
    t = np.asarray(t_hat, dtype=np.float64)
    if t.ndim != 1:
        raise ValueError(f"{name}: must be a 1-D array, got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError(f"{name}: contains non-finite values")
    if t.size:
        lo, hi = float(t.min()), float(t.max())
        if lo < -T_HAT_SLACK or hi > 1.0 + T_HAT_SLACK:
            raise ValueError(f"{name}: training fractions must lie in [0, 1], got [{lo:.6g}, {hi:.6g}]")
        if lo < 0.0 or hi > 1.0:
            t = np.clip(t, 0.0, 1.0)
    if increasing and t.size > 1 and np.any(np.diff(t) <= 0):
        i = int(np.argmax(np.diff(t) <= 0))
        raise ValueError(
            f"{name}: must be strictly increasing (t̂[{i}] = {t[i]:.6g}, t̂[{i + 1}] = {t[i + 1]:.6g})"
        )
    return t


def check_curve(
    t_hat: Any, loss: Any, *, min_points: int = 2, name: str = "curve"
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (t̂, L) pair and return both as float arrays.

    Raises ``ValueError`` when the arrays are not 1-D of one length, have fewer than
    ``min_points`` points, t̂ is not strictly increasing inside [0, 1], or a loss is non-finite
    or ≤ 0. Non-finite losses are never skipped here (use :func:`drop_nonfinite` explicitly).
    """
    y = np.asarray(loss, dtype=np.float64)
    t_arr = np.asarray(t_hat, dtype=np.float64)
    if t_arr.ndim != 1 or y.ndim != 1 or t_arr.shape != y.shape:
        raise ValueError(
            f"{name}: t_hat and loss must be 1-D arrays of one length, got shapes {t_arr.shape} and {y.shape}"
        )
    if y.size < min_points:
        raise ValueError(f"{name}: needs at least {min_points} points, got {y.size}")
    t = check_t_hat(t_arr, name=f"{name}: t_hat")
    finite = np.isfinite(y)
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(
            f"{name}: loss has {int((~finite).sum())} non-finite value(s) (first at t̂ = {t[i]:.4g}); "
            "treat the run as diverged, or drop the points explicitly with drop_nonfinite()"
        )
    if np.any(y <= 0):
        raise ValueError(f"{name}: losses must be > 0 (the normalisation divides by them)")
    return t, y


def drop_nonfinite(t_hat: Any, loss: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return (t̂, L) without the points whose loss or t̂ is NaN/inf (the documented skip)."""
    t = np.asarray(t_hat, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError("drop_nonfinite: t_hat and loss must be 1-D arrays of one length")
    keep = np.isfinite(t) & np.isfinite(y)
    return t[keep], y[keep]


def window_tokens_of(
    *, window_tokens: float | None = None, window_sequences: float | None = None, seq_len: int | None = None
) -> float:
    """The smoothing window in tokens, from tokens or from sequences × seq_len (exactly one)."""
    if (window_tokens is None) == (window_sequences is None):
        raise ValueError("smoothing window: give exactly one of window_tokens or window_sequences")
    if window_sequences is not None:
        if seq_len is None or seq_len <= 0:
            raise ValueError("smoothing window: window_sequences needs seq_len > 0")
        window_tokens = float(window_sequences) * float(seq_len)
    assert window_tokens is not None
    if not np.isfinite(window_tokens) or window_tokens < 0:
        raise ValueError(f"smoothing window: must be a finite number ≥ 0 tokens, got {window_tokens}")
    return float(window_tokens)


def smooth_loss(
    tokens: Any,
    loss: Any,
    *,
    window_tokens: float | None = None,
    window_sequences: float | None = None,
    seq_len: int | None = None,
) -> np.ndarray:
    """Trailing moving average of ``loss`` over a window of tokens (or sequences × seq_len).

    The paper smooths with a moving average over a fixed amount of data (12,288 sequences for
    fitting, App. D.1). Raises ``ValueError`` on non-finite losses (a NaN would spread through
    the window) and on decreasing token counts.
    """
    window = window_tokens_of(window_tokens=window_tokens, window_sequences=window_sequences, seq_len=seq_len)
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("smooth_loss: tokens and loss must be 1-D arrays of one length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("smooth_loss: tokens and loss must be finite (drop_nonfinite() skips bad points)")
    return trailing_mean(x, y, window)


def training_fraction_of(tokens: Any, total_tokens: float) -> np.ndarray:
    """t̂ = tokens / total tokens (paper Table 1), checked to lie in [0, 1]."""
    if not np.isfinite(total_tokens) or total_tokens <= 0:
        raise ValueError(f"total_tokens: must be a finite number > 0, got {total_tokens!r}")
    # equations.training_fraction(step, total_steps) is t/T; tokens/total tokens is the same ratio.
    t = equations.training_fraction(tokens, total_tokens)  # type: ignore[arg-type]
    return check_t_hat(t, increasing=False)


def normalize_loss(loss: Any, final_loss: float | None = None) -> np.ndarray:
    """ℓ = L / L(1) (equations.normalized_loss). ``final_loss`` defaults to the last value."""
    y = np.asarray(loss, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise ValueError("normalize_loss: loss must be a non-empty 1-D array")
    if not np.all(np.isfinite(y)):
        raise ValueError("normalize_loss: loss has non-finite values")
    final = float(y[-1]) if final_loss is None else float(final_loss)
    if not np.isfinite(final) or final <= 0:
        raise ValueError(f"normalize_loss: final loss must be finite and > 0, got {final}")
    return equations.normalized_loss(y, final)

