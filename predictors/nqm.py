"""The paper's noisy quadratic model (NQM) with an LR schedule (paper §3 Eq. 3, App. B.3; docs/paper.md).

AdamW seen as an EMA: θ_k = (1 − α_k)·θ_{k−1} + α_k·x_k with α_k = η_k·λ and white noise x_k.
In training-fraction units τ = 1/(η_peak·λ·T), so α_k = η(t̂_k)/(τ·T). The loss of one quadratic
mode is L = (h/2)·θ². Per-step noise variance T·σ_x² makes the continuous limit match the
paper's Eq. 14–15 exactly (checked in tests/test_nqm.py against ``equations.nqm_expected_loss``).

* :func:`nqm_expected_loss_schedule`: the exact expected loss of the discrete recursion for any
  schedule (moment recursion s_k = (1−α_k)²·s_{k−1} + α_k²·T·σ_x², no sampling).
* :func:`nqm_sample_loss`: a Monte-Carlo run with ``dims`` independent coordinates, i.e. a noisy
  loss curve like a real one.

Used by the tests (the constant-vs-decay ordering inversion of App. B.3 / Fig. 10) and by the
alignment study in docs/predictor.md. Not used at run time.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from predictors import equations
from predictors.schedules import Schedule


def _alphas(tau: np.ndarray, schedule: Schedule, steps: int) -> np.ndarray:
    if steps < 2:
        raise ValueError("nqm: steps must be ≥ 2")
    if np.any(~np.isfinite(tau)) or np.any(tau <= 0):
        raise ValueError("nqm: tau must be finite and > 0")
    if np.any(tau * steps <= 1.0):
        raise ValueError(f"nqm: tau·steps must exceed 1 (α < 1); got tau = {tau.min():.3g}, steps = {steps}")
    t_k = np.arange(1, steps + 1) / steps
    return equations.ema_rate(schedule(t_k)[:, None], tau[None, :], steps)  # (steps, n_tau)


def nqm_expected_loss_schedule(
    t_hat: Any,
    tau: Any,
    schedule: Optional[Schedule] = None,
    *,
    curvature: float = 1.0,
    noise_var: float = 1.0,
    theta0_sq: float = 1.0,
    steps: int = 4000,
) -> np.ndarray:
    """E[L(t̂)] of the discrete NQM under ``schedule`` (default: linear D2Z, 10% warmup).

    ``tau`` may be a scalar or a 1-D array (then the result has shape (len(tau), len(t_hat))).
    Values between optimizer steps are linearly interpolated.
    """
    schedule = schedule or Schedule()
    taus = np.atleast_1d(np.asarray(tau, dtype=np.float64))
    alpha = _alphas(taus, schedule, steps)
    s = np.full(taus.shape, float(theta0_sq))
    out = np.empty((steps + 1, taus.size))
    out[0] = s
    noise = steps * float(noise_var)
    for k in range(steps):
        a = alpha[k]
        s = (1.0 - a) ** 2 * s + a * a * noise
        out[k + 1] = s
    t_grid = np.arange(steps + 1) / steps
    t = np.asarray(t_hat, dtype=np.float64)
    loss = 0.5 * curvature * np.stack([np.interp(t, t_grid, out[:, i]) for i in range(taus.size)])
    return loss[0] if np.ndim(tau) == 0 else loss


def nqm_sample_loss(
    t_hat: Any,
    tau: float,
    schedule: Optional[Schedule] = None,
    *,
    curvature: float = 1.0,
    noise_var: float = 1.0,
    theta0_sq: float = 1.0,
    steps: int = 2000,
    dims: int = 256,
    rng: Optional[np.random.Generator] = None,
) -> np.ndarray:
    """One sampled NQM loss curve: L = (h/2)·mean over ``dims`` coordinates of θ², at ``t_hat``.

    θ(0) is drawn with E[θ(0)²] = ``theta0_sq``; the curve is as noisy as a real one with
    relative noise ≈ √(2/dims) per step (smooth it like one).
    """
    schedule = schedule or Schedule()
    rng = rng or np.random.default_rng(0)
    alpha = _alphas(np.array([float(tau)]), schedule, steps)[:, 0]
    theta = rng.normal(0.0, np.sqrt(theta0_sq), size=dims)
    sd = np.sqrt(steps * float(noise_var))
    out = np.empty(steps + 1)
    out[0] = np.mean(theta * theta)
    for k in range(steps):
        a = alpha[k]
        theta = (1.0 - a) * theta + a * rng.normal(0.0, sd, size=dims)
        out[k + 1] = np.mean(theta * theta)
    t_grid = np.arange(steps + 1) / steps
    return 0.5 * curvature * np.interp(np.asarray(t_hat, dtype=np.float64), t_grid, out)
