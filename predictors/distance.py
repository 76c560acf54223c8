"""The decision error off the calibrated scale, by distance (issue 15).

A pooled cross-scale error (the RMS of every leave-one-TPP-out or leave-one-size-out
prediction) hides what matters for a run beyond the calibrated range: the error grows with
the distance from the calibrated set, and is largest at the end sizes. ``hpo calibrate``
therefore keeps the error of every held-out group, with where it lay
(``predictors.ranking.Position``: the axis, inside or beyond the calibrated range, the
|log| distance to the nearest calibrated value), measured

* leave-one-group-out (one TPP, size or τ held out at a time; interior and end groups), and
* by extrapolation: calibrated on the values up to (down from) each one, every value beyond
  predicted, so that the distances reach as far as the bank allows;

and a run off the calibrated scale gets, per axis on which it is off:

* the error of the held-out groups in the same situation (same axis, same side of the
  calibrated range) held out at least as far away as it is (the rule of
  ``RankingError._off_scale``): the nearest such distance, and the largest error of every
  group held out no farther (so the stated error never falls as the distance grows; the
  farthest extrapolations, with the largest errors, do not inflate a run just off the
  range); or, beyond the farthest group,
* the error grown with the distance, e(s, d)² = e_in(s)² + k(s)²·d², the slope k fitted to the
  groups of that situation (least squares of their excess variance rms² − e_in² on d², each
  weighted by its number of curves), and never below the largest error held out.

Axes add in variance: e² = e_in² + Σ_axis (e_axis² − e_in²). τ = ∞ (no weight decay) against a
bank of finite τ is beyond every distance: the largest error held out across τ applies (a lower
bound, said so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from predictors.ranking import Position


@dataclass(frozen=True)
class ErrorGroup:
    """The decision error measured on one held-out group: how it was held out (``scheme``),
    its value on the axis, where it lay against the values the refit saw, how many curves it
    holds, and the RMS and mean relative error of their predicted finals at the table's stop
    fractions."""

    scheme: str
    value: float
    position: Position
    n: int
    rms: tuple[float, ...]
    bias: tuple[float, ...]

    def __post_init__(self) -> None:
        r = np.asarray(self.rms, dtype=np.float64)
        b = np.asarray(self.bias, dtype=np.float64)
        if r.ndim != 1 or r.shape != b.shape or not (np.all(np.isfinite(r)) and np.all(np.isfinite(b))) or np.any(r < 0):
            raise ValueError("error group: rms and bias must be finite (rms ≥ 0), one per stop fraction")
        if not (self.position.distance >= 0) or self.n < 1:
            raise ValueError("error group: distance ≥ 0 and n ≥ 1 are required")
        object.__setattr__(self, "rms", tuple(float(x) for x in r))
        object.__setattr__(self, "bias", tuple(float(x) for x in b))

    def at(self, fractions: Sequence[float], s: float) -> float:
        return float(np.interp(s, fractions, self.rms))

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "value": self.value, "axis": self.position.axis,
                "inside": self.position.inside, "distance": self.position.distance, "n": self.n,
                "rms": list(self.rms), "bias": list(self.bias)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ErrorGroup":
        return cls(str(data["scheme"]), float(data["value"]),
                   Position(str(data["axis"]), bool(data["inside"]), float(data["distance"])),
                   int(data["n"]), tuple(data["rms"]), tuple(data["bias"]))


def slope_squared(groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float) -> float:
    """k(s)² of e² = e_in² + k²·d²: weighted least squares of (rms² − e_in²)₊ on d²."""
    num = den = 0.0
    for g in groups:
        d = g.position.distance
        if not (d > 0 and math.isfinite(d)):
            continue
        excess = max(0.0, g.at(fractions, s) ** 2 - e_in * e_in)
        num += g.n * excess * d * d
        den += g.n * d ** 4
    return num / den if den > 0 else 0.0


def axis_error(
    groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float, position: Position,
) -> Optional[tuple[float, str]]:
    """(e(s) for a run at ``position``, in words) from the groups held out on its axis (module
    docstring), or None when none was held out on that axis."""
    on_axis = [g for g in groups if g.position.axis == position.axis]
    if not on_axis:
        return None
    side = "inside" if position.inside else "beyond"
    same = [g for g in on_axis if g.position.inside == position.inside]
    note = ""
    if not same:
        same = on_axis
        note = f" (none was held out {side} the calibrated range: all groups on the axis)"
    d = position.distance
    if math.isinf(d):
        g = max(same, key=lambda g: g.at(fractions, s))
        return g.at(fractions, s), (f"{position.axis} beyond every calibrated value: the largest error held out "
                                    f"on the axis ({g.scheme}, {g.value:g}), a lower bound{note}")
    far = [g.position.distance for g in same if g.position.distance >= d - 1e-9]
    if far:
        # Monotone in distance: every group held out no farther than the nearest one at least as
        # far as the run (so a nearer group with a larger error is never ignored).
        reach = min(far)
        near = [g for g in same if g.position.distance <= reach + 1e-9]
        g = max(near, key=lambda g: g.at(fractions, s))
        return g.at(fractions, s), (f"{g.scheme} at {position.axis} {g.value:g} held out ({g.position.words()}; "
                                    f"this run: {d:.2f}){note}")
    farthest = max(same, key=lambda g: g.position.distance)
    k2 = slope_squared(same, fractions, s, e_in)
    grown = math.sqrt(e_in * e_in + k2 * d * d)
    largest = max(g.at(fractions, s) for g in same)
    value = max(grown, largest)
    return value, (f"{position.axis} {side} the calibrated range at {d:.2f} in log, farther than any held-out group "
                   f"(farthest {farthest.position.distance:.2f}): the error grown with distance, "
                   f"e² = e_in² + k²·d² fitted to {len(same)} held-out groups{note}")


def off_scale_error(
    groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float, positions: Sequence[Position],
) -> tuple[Optional[float], list[str], list[Position]]:
    """(combined e(s) over the axes that have groups, words per axis, positions on axes without
    any group). The combined error is None when no position has a group on its axis."""
    excess, words, unmeasured = 0.0, [], []
    measured = False
    for pos in positions:
        found = axis_error(groups, fractions, s, e_in, pos)
        if found is None:
            unmeasured.append(pos)
            continue
        measured = True
        value, why = found
        excess += max(0.0, value * value - e_in * e_in)
        words.append(why)
    return (math.sqrt(e_in * e_in + excess) if measured else None), words, unmeasured
