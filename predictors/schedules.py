"""Learning-rate schedules as functions of the training fraction t̂ ∈ [0, 1].

Every schedule is peak-normalised: it returns the multiplier η(t̂)/η_peak ∈ [0, 1].
This module is the single definition shared by the predictor (whose surrogate evaluates
η(t̂), paper Eq. 4) and by the trainer (which multiplies each parameter group's peak LR by
it). It lives in ``predictors``, the lowest layer, so the trainer imports it and not the
other way round; it imports numpy only, never torch.

Schedules (all start with a linear warmup from 0 to 1 over ``warmup_fraction``):

* ``linear``     -- linear decay to zero ("D2Z"), the paper's schedule and our default.
* ``constant``   -- stays at the peak.
* ``cosine``     -- half-cosine decay to zero.
* ``wsd``        -- warmup-stable-decay: constant, then linear decay to zero over the
                    final ``decay_fraction`` of training.
* ``linear_10x`` -- linear decay to 0.1 of the peak ("10× decay", paper App. B.4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

ScheduleName = Literal["linear", "constant", "cosine", "wsd", "linear_10x"]
SCHEDULE_NAMES: tuple[str, ...] = ("linear", "constant", "cosine", "wsd", "linear_10x")


@dataclass(frozen=True)
class Schedule:
    """A peak-normalised LR schedule over the training fraction.

    Args:
        name: one of ``SCHEDULE_NAMES``.
        warmup_fraction: fraction of training spent in linear warmup, in [0, 1).
        decay_fraction: for ``wsd`` only, the final fraction of training spent decaying,
            in (0, 1 - warmup_fraction].
    """

    name: ScheduleName = "linear"
    warmup_fraction: float = 0.1
    decay_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.name not in SCHEDULE_NAMES:
            raise ValueError(f"schedule: unknown name {self.name!r}; expected one of {SCHEDULE_NAMES}")
        if not (0.0 <= self.warmup_fraction < 1.0) or not math.isfinite(self.warmup_fraction):
            raise ValueError(f"warmup_fraction: {self.warmup_fraction} is outside [0, 1)")
        if self.name == "wsd" and not (0.0 < self.decay_fraction <= 1.0 - self.warmup_fraction):
            raise ValueError(
                f"decay_fraction: {self.decay_fraction} must be in (0, 1 - warmup_fraction]"
            )

    def __call__(self, t_hat: Any) -> np.ndarray:
        """Return η(t̂)/η_peak for a scalar or array of training fractions."""
        t = np.clip(np.asarray(t_hat, dtype=np.float64), 0.0, 1.0)
        w = self.warmup_fraction
        # Warmup ramps from 0 at t̂ = 0 to 1 at t̂ = w (no warmup when w = 0).
        warm = np.minimum(t / w, 1.0) if w > 0 else np.ones_like(t)
        # Progress through the post-warmup phase, in [0, 1].
        after = np.clip((t - w) / (1.0 - w), 0.0, 1.0)
        if self.name == "linear":
            decay = 1.0 - after
        elif self.name == "constant":
            decay = np.ones_like(t)
        elif self.name == "cosine":
            decay = 0.5 * (1.0 + np.cos(np.pi * after))
        elif self.name == "linear_10x":
            decay = 1.0 - 0.9 * after
        else:  # wsd
            start = 1.0 - self.decay_fraction
            decay = np.clip((1.0 - t) / self.decay_fraction, 0.0, 1.0)
            decay = np.where(t < start, 1.0, decay)
        return np.where(t < w, warm, decay)

    def at(self, t_hat: float) -> float:
        """Scalar convenience wrapper used in the training loop."""
        return float(self(t_hat))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Schedule":
        return cls(**data)
