"""The three controls a normalised loss curve depends on (paper §3): τ, TPP and the schedule."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from predictors.schedules import Schedule


@dataclass(frozen=True)
class Controls:
    """The TLC controls of one run.

    Args:
        tau: AdamW timescale τ = B/(η·λ·D) (paper Eq. 2), > 0; ``math.inf`` for a run without
            weight decay (λ = 0, "vanilla Adam", the τ = ∞ limit of paper App. B.3).
        tokens_per_param: TPP = D/N, > 0.
        schedule: the peak-normalised LR schedule, warmup included. The default is
            ``Schedule()``: linear decay to zero after a 10% warmup (our trainer's default);
            give the run's own schedule and warmup, since a wrong warmup shifts the early
            shape the prediction aligns to.
        n_params: the run's non-embedding parameter count N, when known. A predictor
            calibrated on several sizes uses it in the prediction (a size term or reference
            curves interpolated in log N) and to judge how far the run is from the calibrated
            sizes (which error it states); without it the predictor warns and assumes a
            calibrated size.
    """

    tau: float
    tokens_per_param: float
    schedule: Schedule = field(default_factory=Schedule)
    n_params: Optional[float] = None

    def __post_init__(self) -> None:
        tau = self.tau
        if not isinstance(tau, (int, float)) or math.isnan(tau) or tau <= 0:
            raise ValueError(f"tau: must be a number > 0 (math.inf for no weight decay), got {tau!r}")
        tpp = self.tokens_per_param
        if not isinstance(tpp, (int, float)) or not math.isfinite(tpp) or tpp <= 0:
            raise ValueError(f"tokens_per_param: must be a finite number > 0, got {tpp!r}")
        n = self.n_params
        if n is not None and (not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0):
            raise ValueError(f"n_params: must be a finite number > 0 or None, got {n!r}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tau": float(self.tau),
            "tokens_per_param": float(self.tokens_per_param),
            "schedule": self.schedule.name,
            "warmup_fraction": float(self.schedule.warmup_fraction),
            "decay_fraction": float(self.schedule.decay_fraction),
            "final_fraction": float(self.schedule.final_fraction),
            "decay_shape": self.schedule.decay_shape,
        }
        if self.schedule.points is not None:
            out["schedule_points"] = [list(self.schedule.points[0]), list(self.schedule.points[1])]
        if self.n_params is not None:
            out["n_params"] = float(self.n_params)
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Controls":
        """Build from a flat mapping such as a Ray Tune result or a curve bank row.

        Keys: ``tau``, ``tokens_per_param``, ``schedule`` (name, default ``linear``),
        ``warmup_fraction`` (default 0.1), ``decay_fraction`` (default 0.2), ``final_fraction``
        (default 0), ``decay_shape`` (default ``linear``), ``schedule_points`` (a ``logged``
        schedule's ``[[t̂...], [lr...]]``, as a list or its JSON string), ``n_params``
        (optional; a missing, non-finite or non-positive value is left unknown). Give the
        run's own warmup: the default 10% is our trainer's, and a wrong warmup shifts the early
        shape the prediction aligns to. Give ``n_params``: without it a predictor calibrated on
        sizes assumes a calibrated size and warns (:class:`predictors.NParamsMissingWarning`).

        Example:
            A row of a curve file or a Ray Tune result (extra keys are ignored; strings from a
            CSV are numbers):

            >>> from predictors import Controls
            >>> row = {"tau": "0.3", "tokens_per_param": 20, "schedule": "cosine",
            ...        "warmup_fraction": 0, "n_params": 100672, "lr": 0.01}
            >>> c = Controls.from_mapping(row)
            >>> c.tau, c.schedule.name, c.schedule.warmup_fraction, c.n_params
            (0.3, 'cosine', 0.0, 100672.0)
            >>> Controls.from_mapping({"tau": 0.3})
            Traceback (most recent call last):
            ...
            KeyError: 'controls: missing tokens_per_param'
        """
        missing = [k for k in ("tau", "tokens_per_param") if data.get(k) is None]
        if missing:
            raise KeyError(f"controls: missing {', '.join(missing)}")
        points = data.get("schedule_points")
        if isinstance(points, str):
            try:
                points = json.loads(points)
            except ValueError:
                raise ValueError(f"schedule_points: not JSON ([[t...], [lr...]]): {points[:80]!r}") from None
        schedule = Schedule(
            name=str(data.get("schedule", "linear")),  # type: ignore[arg-type]
            warmup_fraction=float(data.get("warmup_fraction", 0.1)),
            decay_fraction=float(data.get("decay_fraction", 0.2)),
            final_fraction=float(_given(data, "final_fraction", 0.0)),
            decay_shape=str(_given(data, "decay_shape", "linear")),  # type: ignore[arg-type]
            points=points if points is not None and str(data.get("schedule")) == "logged" else None,
        )
        n_params: Optional[float] = None
        try:
            raw = float(data.get("n_params"))  # type: ignore[arg-type]
            n_params = raw if math.isfinite(raw) and raw > 0 else None
        except (TypeError, ValueError):
            n_params = None
        return cls(float(data["tau"]), float(data["tokens_per_param"]), schedule, n_params)


def _given(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """``data[key]``, or ``default`` where it is absent or empty (a bank read back fills the
    columns of older rows with NaN or None)."""
    value = data.get(key)
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return default
    return value
