"""Reference curves: the normalised curves of calibrated runs, interpolated in log N (issue 15).

The paper's HPO procedure (§5, steps 2–3) trains a small model for each combination of
controls (schedule, τ, TPP) the sweep uses and takes its normalised curve ℓ(t̂) as the
"universal" curve the large runs are aligned to; the fitted surrogate (Eq. 4–5) is its
alternative, and the one the paper's results use. The surrogate carries nothing that depends
on the model size N, so when normalised curves drift with N (they do at our scale: ℓ(0.1)
≈ 1.35 at 0.1M, ≈ 1.55 at 1.2M) every cross-size prediction inherits that drift.
:class:`ReferenceCurves` is steps 2–3 with more than one size: for a run with controls c and
size N,

* the calibrated runs with matching controls (same schedule and warmup, τ and TPP within
  ``MATCH_TOLERANCE``) are averaged per size (seeds, and η or B at the same τ, share one
  normalised curve: that is the collapse);
* between the smallest and largest such size, ℓ(t̂) is interpolated linearly in log N;
* beyond them, ``extrapolation`` decides: ``"hold"`` takes the nearest size's curve as it
  is (the "nearest-width" rule), ``"surrogate"`` multiplies it by the predictor's own
  size trend, ℓ̂(t̂; c, N)/ℓ̂(t̂; c, N_nearest) (1 without a size term, i.e. "hold");
* before a reference's first logged point, the curve continues along the surrogate
  (ℓ_ref(t₀)·ℓ̂(t̂)/ℓ̂(t₀)).

A run whose controls match no reference, or whose N is unknown, has no reference curve:
the predictor uses its surrogate and says so. Which of surrogate, size term and reference
curves a calibration ships is decided by leave-one-size-out (``hpo.calibration.held_out``).

Example:
    Two sizes whose normalised curves differ by a constant 10% offset early on; a run half-way
    between them in log N gets the mean, and one beyond the larger size (``hold``) the larger's:

    >>> import numpy as np
    >>> from predictors import Controls, Curve
    >>> t = np.linspace(0.01, 1.0, 100)
    >>> def run(n, bump):
    ...     c = Controls(0.4, 20, n_params=n)
    ...     return Curve(t, 2.0 * (1 + bump * (1 - t)), c, {"n_params": n})
    >>> refs = ReferenceCurves.from_curves([run(1e5, 0.2), run(4e5, 0.4)])
    >>> ell, why = refs.normalized(np.array([0.01, 1.0]), Controls(0.4, 20, n_params=2e5))
    >>> np.round(ell, 3).tolist(), why
    ([1.297, 1.0], 'reference curves at N = 1e+05 and 4e+05, interpolated in log N')
    >>> ell, why = refs.normalized(np.array([0.01]), Controls(0.4, 20, n_params=1.6e6))
    >>> np.round(ell, 3).tolist(), why
    ([1.396], 'reference curve at N = 4e+05 (the nearest calibrated size, held)')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import numpy as np

from predictors.controls import Controls
from predictors.curves import Curve, curve_size
from predictors.schedules import FRACTION_TOLERANCE, Schedule

#: τ and TPP of a run match a reference within this relative distance (the same tolerance as
#: ``predictors.ranking.SCALE_TOLERANCE``: "at a calibrated value").
MATCH_TOLERANCE = 0.1
#: Curves within this relative distance of τ, TPP and N are one reference (averaged).
SAME_TOLERANCE = 0.01
# Warmup, floor and WSD decay fractions match within FRACTION_TOLERANCE (absolute), the
# tolerance of Schedule.same_as, imported from predictors.schedules.
#: Most points stored per reference curve (the bank's curves hold ~100–1,000).
MAX_POINTS = 160

Extrapolation = Literal["hold", "surrogate"]
EXTRAPOLATIONS: tuple[str, ...] = ("hold", "surrogate")


@dataclass(frozen=True)
class ReferenceCurve:
    """The mean normalised curve ℓ(t̂) = L/L(last point) of the calibrated runs with one set of
    controls at one size ``n_params`` (``n_curves`` runs averaged)."""

    tau: float
    tokens_per_param: float
    schedule: Schedule
    n_params: float
    t_hat: tuple[float, ...]
    ell: tuple[float, ...]
    n_curves: int = 1

    def __post_init__(self) -> None:
        t = np.asarray(self.t_hat, dtype=np.float64)
        e = np.asarray(self.ell, dtype=np.float64)
        if t.ndim != 1 or t.size < 2 or t.shape != e.shape:
            raise ValueError("reference curve: t_hat and ell must be 1-D of one length ≥ 2")
        if not (np.all(np.isfinite(t)) and np.all(np.isfinite(e)) and np.all(e > 0)):
            raise ValueError("reference curve: values must be finite (ℓ > 0)")
        if t[0] < 0 or t[-1] > 1 or np.any(np.diff(t) <= 0):
            raise ValueError("reference curve: t_hat must increase strictly inside [0, 1]")
        if not (self.tau > 0 and math.isfinite(self.tokens_per_param) and self.tokens_per_param > 0
                and math.isfinite(self.n_params) and self.n_params > 0):
            raise ValueError("reference curve: τ > 0, TPP > 0 and n_params > 0 are required")
        object.__setattr__(self, "t_hat", tuple(float(x) for x in t))
        object.__setattr__(self, "ell", tuple(float(x) for x in e))
        object.__setattr__(self, "_t", t)
        object.__setattr__(self, "_e", e)

    @property
    def controls(self) -> Controls:
        return Controls(self.tau, self.tokens_per_param, self.schedule, self.n_params)

    def matches(self, controls: Controls) -> bool:
        """Same schedule (:meth:`Schedule.same_as`: name, warmup, floor, WSD decay and shape,
        logged points) and τ, TPP within ``MATCH_TOLERANCE``."""
        if not controls.schedule.same_as(self.schedule):
            return False
        if math.isinf(self.tau) or math.isinf(controls.tau):
            tau_ok = math.isinf(self.tau) and math.isinf(controls.tau)
        else:
            tau_ok = abs(controls.tau / self.tau - 1.0) <= MATCH_TOLERANCE
        return tau_ok and abs(controls.tokens_per_param / self.tokens_per_param - 1.0) <= MATCH_TOLERANCE

    def at(self, t: np.ndarray, surrogate: Optional[Callable[[np.ndarray, Controls], np.ndarray]]) -> np.ndarray:
        """ℓ at ``t``; before the first stored point along ``surrogate`` (held flat without one)."""
        out = np.interp(t, self._t, self._e)  # type: ignore[attr-defined]
        early = t < self._t[0]  # type: ignore[attr-defined]
        if np.any(early) and surrogate is not None:
            t0 = np.array([self._t[0]])  # type: ignore[attr-defined]
            ratio = surrogate(t[early], self.controls) / surrogate(t0, self.controls)[0]
            out[early] = self._e[0] * ratio  # type: ignore[attr-defined]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "tokens_per_param": self.tokens_per_param, "schedule": self.schedule.to_dict(),
                "n_params": self.n_params, "n_curves": self.n_curves,
                "t_hat": [float(f"{x:.6g}") for x in self.t_hat], "ell": [float(f"{x:.7g}") for x in self.ell]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReferenceCurve":
        tau = data["tau"]
        return cls(math.inf if tau is None else float(tau), float(data["tokens_per_param"]),
                   Schedule.from_dict(dict(data["schedule"])), float(data["n_params"]),
                   tuple(data["t_hat"]), tuple(data["ell"]), int(data.get("n_curves", 1)))


@dataclass(frozen=True)
class ReferenceCurves:
    """Calibrated normalised curves by controls and size (module docstring).

    Args:
        curves: one :class:`ReferenceCurve` per (controls, size).
        extrapolation: beyond the calibrated sizes, ``"hold"`` the nearest size's curve or
            follow the ``"surrogate"``'s size trend from it.
    """

    curves: tuple[ReferenceCurve, ...] = field(default_factory=tuple)
    extrapolation: Extrapolation = "hold"

    def __post_init__(self) -> None:
        if self.extrapolation not in EXTRAPOLATIONS:
            raise ValueError(f"reference curves: extrapolation {self.extrapolation!r} is not one of {EXTRAPOLATIONS}")
        object.__setattr__(self, "curves", tuple(self.curves))

    @classmethod
    def from_curves(cls, curves: Sequence[Curve], *, extrapolation: Extrapolation = "hold",
                    max_points: int = MAX_POINTS) -> "ReferenceCurves":
        """Average the normalised curves of ``curves`` per (schedule, τ, TPP, N); curves that do
        not report N are left out (a reference needs its size)."""
        groups: list[tuple[Controls, float, list[Curve]]] = []
        for c in curves:
            n = curve_size(c)
            if n is None:
                continue
            for ctrl, size, members in groups:
                if (abs(n / size - 1.0) <= SAME_TOLERANCE and ctrl.schedule == c.controls.schedule
                        and _close(ctrl.tau, c.controls.tau) and _close(ctrl.tokens_per_param, c.controls.tokens_per_param)):
                    members.append(c)
                    break
            else:
                groups.append((c.controls, n, [c]))
        out = []
        for ctrl, size, members in groups:
            start = max(float(m.t_hat[0]) for m in members)
            t = members[0].t_hat[members[0].t_hat >= start]
            if t.size > max_points:  # thin evenly, keeping both ends
                t = t[np.unique(np.round(np.linspace(0, t.size - 1, max_points)).astype(int))]
            ell = np.mean([np.interp(t, m.t_hat, m.normalized) for m in members], axis=0)
            out.append(ReferenceCurve(float(ctrl.tau), float(ctrl.tokens_per_param), ctrl.schedule, float(size),
                                      tuple(t), tuple(ell), len(members)))
        return cls(tuple(out), extrapolation)

    def sizes(self, controls: Controls) -> list[float]:
        """The calibrated sizes with a reference for these controls, ascending."""
        return sorted({r.n_params for r in self.curves if r.matches(controls)})

    def normalized(
        self, t: np.ndarray, controls: Controls,
        surrogate: Optional[Callable[[np.ndarray, Controls], np.ndarray]] = None,
    ) -> tuple[Optional[np.ndarray], str]:
        """(ℓ at ``t`` for a run with ``controls``, how it was made), or (None, why not) when no
        reference matches the controls or N is unknown. ``surrogate(t, controls)`` is the
        predictor's ℓ̂, used before a reference's first point and for ``"surrogate"``
        extrapolation."""
        if controls.n_params is None:
            return None, "N not reported: no reference size to interpolate from"
        by_size: dict[float, ReferenceCurve] = {}
        for r in self.curves:
            if r.matches(controls):
                # Several references at one size (τ 0.1 and 0.105, say): the closest controls.
                if r.n_params not in by_size or _gap(r, controls) < _gap(by_size[r.n_params], controls):
                    by_size[r.n_params] = r
        if not by_size:
            return None, "no calibrated run with these controls (schedule, τ, TPP)"
        sizes = sorted(by_size)
        n = float(controls.n_params)
        x = math.log(n)
        xs = [math.log(s) for s in sizes]
        if len(sizes) >= 2 and xs[0] <= x <= xs[-1]:
            j = min(int(np.searchsorted(xs, x, side="right")), len(xs) - 1)
            lo, hi = by_size[sizes[j - 1]], by_size[sizes[j]]
            w = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
            ell = (1.0 - w) * lo.at(t, surrogate) + w * hi.at(t, surrogate)
            if w in (0.0, 1.0):
                return ell, f"reference curve at N = {sizes[j - 1] if w == 0 else sizes[j]:.3g}"
            return ell, f"reference curves at N = {sizes[j - 1]:.3g} and {sizes[j]:.3g}, interpolated in log N"
        nearest = sizes[0] if x < xs[0] else sizes[-1]
        ref = by_size[nearest]
        ell = ref.at(t, surrogate)
        if abs(n / nearest - 1.0) <= SAME_TOLERANCE:
            return ell, f"reference curve at N = {nearest:.3g}"
        if self.extrapolation == "surrogate" and surrogate is not None:
            ratio = surrogate(t, controls) / surrogate(t, replace(controls, n_params=nearest))
            return ell * ratio, (f"reference curve at N = {nearest:.3g} (the nearest calibrated size), "
                                 "extrapolated along the surrogate's size trend")
        return ell, f"reference curve at N = {nearest:.3g} (the nearest calibrated size, held)"

    def to_dict(self) -> dict[str, Any]:
        return {"extrapolation": self.extrapolation, "curves": [r.to_dict() for r in self.curves]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReferenceCurves":
        return cls(tuple(ReferenceCurve.from_dict(r) for r in data.get("curves") or []),
                   data.get("extrapolation", "hold"))


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return math.isinf(a) and math.isinf(b)
    return abs(a / b - 1.0) <= SAME_TOLERANCE


def _gap(ref: ReferenceCurve, controls: Controls) -> float:
    tau = 0.0 if math.isinf(ref.tau) else abs(math.log(controls.tau / ref.tau))
    return tau + abs(math.log(controls.tokens_per_param / ref.tokens_per_param))
