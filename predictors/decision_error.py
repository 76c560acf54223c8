"""The calibrated decision error: the relative error of a predicted final loss, by stop fraction.

Measured in-sample by the fit (``predictors.fit``) and held out by ``hpo calibrate``; how far a
run lies off the calibrated scale picks which error applies (``predictors.distance``,
:meth:`predictors.predictor.Predictor.relative_error`).

Example:
    >>> e = DecisionError((0.1, 0.5), (0.04, 0.01))
    >>> e.at(0.3), e.at(0.9)
    (0.025, 0.01)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from predictors.distance import ErrorGroup

#: The stop fractions at which fit() measures the decision error by default.
DECISION_FRACTIONS = (0.1, 0.2, 0.3, 0.5)


@dataclass(frozen=True)
class DecisionError:
    """Calibrated relative error of the predicted final loss, by stop fraction.

    ``rel_error[i]`` is the ``statistic`` (``"rms"`` by default) of
    (predicted final / true final − 1) over the calibration curves when predicting from the
    first ``stop_fractions[i]`` of training. Between table points it is interpolated linearly;
    outside the table it is held at the nearest end (documented in docs/predictor.md).

    ``cross_scale`` (optional, same stop fractions) is the error measured across scales: the
    predictor refitted without one model size or one TPP of the bank and scored on it
    (``cross_scale_source`` says which), pooled over the held-out groups.

    ``groups`` (optional) are the same errors per held-out group, with where each lay
    (``predictors.distance``): a run off the calibrated scale gets the error of the groups
    held out in the same situation at least as far away, grown with distance beyond the
    farthest. The pooled ``cross_scale`` applies only on axes without groups (older files).
    """

    stop_fractions: tuple[float, ...]
    rel_error: tuple[float, ...]
    statistic: str = "rms"
    n_curves: int = 0
    source: str = "in-sample"
    bias: Optional[tuple[float, ...]] = None
    cross_scale: Optional[tuple[float, ...]] = None
    cross_scale_source: Optional[str] = None
    groups: tuple[ErrorGroup, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        for g in self.groups:
            if not isinstance(g, ErrorGroup) or len(g.rms) != len(self.stop_fractions):
                raise ValueError("decision_error: every group must be an ErrorGroup with one error per stop fraction")
        s = np.asarray(self.stop_fractions, dtype=np.float64)
        e = np.asarray(self.rel_error, dtype=np.float64)
        if s.ndim != 1 or s.size == 0 or s.shape != e.shape:
            raise ValueError("decision_error: stop_fractions and rel_error must be non-empty lists of one length")
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(e))):
            raise ValueError("decision_error: values must be finite")
        if np.any(s <= 0) or np.any(s > 1) or np.any(np.diff(s) <= 0):
            raise ValueError("decision_error: stop_fractions must be strictly increasing in (0, 1]")
        if np.any(e < 0):
            raise ValueError("decision_error: rel_error must be ≥ 0")
        if self.bias is not None and len(self.bias) != s.size:
            raise ValueError("decision_error: bias must have one entry per stop fraction")
        if self.cross_scale is not None:
            c = np.asarray(self.cross_scale, dtype=np.float64)
            if c.shape != s.shape or not np.all(np.isfinite(c)) or np.any(c < 0):
                raise ValueError("decision_error: cross_scale must hold one finite error ≥ 0 per stop fraction")
            object.__setattr__(self, "cross_scale", tuple(float(x) for x in c))
        object.__setattr__(self, "stop_fractions", tuple(float(x) for x in s))
        object.__setattr__(self, "rel_error", tuple(float(x) for x in e))
        if self.bias is not None:
            object.__setattr__(self, "bias", tuple(float(x) for x in self.bias))
        object.__setattr__(self, "_s", s)
        object.__setattr__(self, "_e", e)

    def at(self, stop_fraction: float) -> float:
        """Relative error at ``stop_fraction`` (linear between table points, clamped outside)."""
        return float(np.interp(stop_fraction, self._s, self._e))  # type: ignore[attr-defined]

    def cross_scale_at(self, stop_fraction: float) -> Optional[float]:
        """The cross-scale error at ``stop_fraction`` (as :meth:`at`), or None if not measured."""
        if self.cross_scale is None:
            return None
        return float(np.interp(stop_fraction, self._s, np.asarray(self.cross_scale)))  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stop_fractions": list(self.stop_fractions),
            "rel_error": list(self.rel_error),
            "statistic": self.statistic,
            "n_curves": int(self.n_curves),
            "source": self.source,
            "bias": None if self.bias is None else list(self.bias),
            "cross_scale": None if self.cross_scale is None else list(self.cross_scale),
            "cross_scale_source": self.cross_scale_source,
            "groups": [g.to_dict() for g in self.groups] if self.groups else None,
        }

    @classmethod
    def from_model(cls, d: Any) -> "DecisionError":
        """From the validated ``decision_error`` section of a predictor file
        (``predictors.predictor_file.DecisionErrorModel``)."""
        return cls(
            tuple(d.stop_fractions), tuple(d.rel_error), d.statistic, d.n_curves, d.source,
            None if d.bias is None else tuple(d.bias),
            None if d.cross_scale is None else tuple(d.cross_scale), d.cross_scale_source,
            tuple(ErrorGroup.from_dict(g) for g in d.groups or []),
        )


__all__ = ["DECISION_FRACTIONS", "DecisionError"]
