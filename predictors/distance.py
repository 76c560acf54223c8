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

and a run off the calibrated scale gets, per axis on which it is off, the error of the held-out
groups in the same situation (same axis; inside the calibrated range, or beyond it on the same
side: above the largest value or below the smallest, where the groups record it) at its
distance d:

* e(s, d)² = e_in(s)² + k(s)²·d², the slope k fitted to the groups of that situation (least
  squares of their excess variance rms² − e_in² on d², each weighted by its number of curves):
  the RMS error those groups show at that distance, so that the stated σ is about the size of
  the errors (issue 28; it was the largest error of any group held out no farther, which let
  one poor extrapolation from two sizes set a band 5–18× the errors of every run).

The axes add in variance, except that TPP and model size count one distance once: a run whose
N and TPP are both off (a fixed token budget moves both by the same log distance) gets the
larger of the two excesses, not their sum; τ adds. τ = ∞ (no weight decay) against a bank of
finite τ is beyond every distance: the largest error held out across τ applies (a lower
bound, said so).

The order of a sweep off the calibrated scale (``predictors.ranking.RankingError.order_at``)
selects its held-out groups the same way (``Position.analogous``: same axis, same side of the
range) but keeps a different rule on purpose: its scale is the keep margin, where an
understated error stops the best trial, so it takes the worst case of the groups held out at
least as far, from one entry that also gives the blend weight; this error is a band stated to
the user, which must be about the size of the errors, so it is the RMS trend at the distance.
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
    #: Beyond the calibrated range: "above" its largest value or "below" its smallest (None:
    #: inside, or not recorded: files before issue 28, matched on either side).
    direction: Optional[str] = None

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
        out = {"scheme": self.scheme, "value": self.value, "axis": self.position.axis,
               "inside": self.position.inside, "distance": self.position.distance, "n": self.n,
               "rms": list(self.rms), "bias": list(self.bias)}
        if self.direction is not None:
            out["direction"] = self.direction
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ErrorGroup":
        direction = data.get("direction")
        return cls(str(data["scheme"]), float(data["value"]),
                   Position(str(data["axis"]), bool(data["inside"]), float(data["distance"])),
                   int(data["n"]), tuple(data["rms"]), tuple(data["bias"]),
                   None if direction is None else str(direction))


def direction_of(value: float, calibrated: Sequence[float]) -> Optional[str]:
    """"above" when ``value`` lies above every calibrated value, "below" when below every one,
    else None (inside, or nothing calibrated)."""
    refs = [float(c) for c in calibrated if c is not None and math.isfinite(float(c))]
    if not refs or not math.isfinite(value):
        return None
    return "above" if value > max(refs) else "below" if value < min(refs) else None


#: Axes one distance can move together (a fixed token budget: N up, TPP down by the same factor):
#: their excess errors are not added (module docstring).
SCALE_AXES = ("tokens_per_param", "n_params")


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


@dataclass(frozen=True)
class AxisFit:
    """The held-out groups that judge runs in one situation (axis; inside, or beyond on one
    side) and the trend fitted to them: what :func:`axis_error` needs besides the run's
    distance, so that a sweep's many τ in one situation share one fit."""

    axis: str
    side: str  # "inside", "beyond", or "above/below the calibrated range"
    note: str
    k2: float  # k(s)² of e² = e_in² + k²·d²
    n_groups: int
    nearest: float  # the held-out groups' distances, nearest and farthest
    farthest: float
    largest: float  # the largest error held out there, and its group's words (for d = ∞)
    largest_words: str

    def error(self, e_in: float, d: float) -> tuple[float, str]:
        """(e(s) at distance ``d``, in words): :func:`axis_error` of a run at ``d``."""
        if math.isinf(d):
            return self.largest, (f"{self.axis} beyond every calibrated value: the largest error held out "
                                  f"on the axis ({self.largest_words}), a lower bound{self.note}")
        value = math.sqrt(e_in * e_in + self.k2 * d * d)
        beyond = (f"; farther than any held-out group (farthest {self.farthest:.2f}): the trend is extrapolated"
                  if d > self.farthest + 1e-9 else "")
        return value, (f"{self.axis} {self.side}, {d:.2f} in log: e² = e_in² + k²·d² fitted to the errors of "
                       f"{self.n_groups} groups held out there (distances {self.nearest:.2f}–"
                       f"{self.farthest:.2f}){beyond}{self.note}")


def axis_fit(
    groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float, position: Position,
    direction: Optional[str] = None,
) -> Optional[AxisFit]:
    """The :class:`AxisFit` for runs in ``position``'s situation (its distance is not read),
    or None when no group was held out on its axis."""
    on_axis = [g for g in groups if g.position.axis == position.axis]
    if not on_axis:
        return None
    side = "inside" if position.inside else "beyond"
    same = [g for g in on_axis if position.analogous(g.position)]
    note = ""
    if not same:
        same = on_axis
        note = f" (none was held out {side} the calibrated range: all groups on the axis)"
    elif not position.inside and direction is not None:
        # Beyond on the same side: extrapolating up from the small sizes is not extrapolating down.
        sided = [g for g in same if g.direction in (None, direction)]
        if sided:
            same = sided
            side = f"{direction} the calibrated range"
        else:
            note = f" (none was held out {direction} the calibrated range: both sides)"
    worst = max(same, key=lambda g: g.at(fractions, s))
    distances = [g.position.distance for g in same]
    return AxisFit(position.axis, side, note, slope_squared(same, fractions, s, e_in), len(same), min(distances),
                   max(distances), worst.at(fractions, s), f"{worst.scheme}, {worst.value:g}")


def axis_error(
    groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float, position: Position,
    direction: Optional[str] = None,
) -> Optional[tuple[float, str]]:
    """(e(s) for a run at ``position``, ``direction`` "above"/"below" when beyond, in words)
    from the groups held out on its axis (module docstring), or None when none was held out on
    that axis."""
    fit = axis_fit(groups, fractions, s, e_in, position, direction)
    return None if fit is None else fit.error(e_in, position.distance)


def off_scale_error(
    groups: Sequence[ErrorGroup], fractions: Sequence[float], s: float, e_in: float, positions: Sequence[Position],
    directions: Optional[Mapping[str, str]] = None, fits: Optional[dict[Any, Optional[AxisFit]]] = None,
) -> tuple[Optional[float], list[str], list[Position]]:
    """(combined e(s) over the axes that have groups, words per axis, positions on axes without
    any group). The combined error is None when no position has a group on its axis.
    ``directions``: per axis, "above"/"below" for a position beyond the calibrated range. TPP and
    model size share one excess (the larger), τ adds (module docstring). ``fits``: a memo of
    :func:`axis_fit` by situation, for a caller that asks again with the same groups (a
    predictor: a sweep's trials differ in distance, rarely in situation)."""
    directions = directions or {}
    scale_excess, other_excess, words, unmeasured = 0.0, 0.0, [], []
    measured = False
    scale_axes = 0
    for pos in positions:
        direction = directions.get(pos.axis) if not pos.inside else None
        key = (s, e_in, pos.axis, pos.inside, direction)
        if fits is None or key not in fits:
            fit = axis_fit(groups, fractions, s, e_in, pos, direction)
            if fits is not None:
                fits[key] = fit
        else:
            fit = fits[key]
        found = None if fit is None else fit.error(e_in, pos.distance)
        if found is None:
            unmeasured.append(pos)
            continue
        measured = True
        value, why = found
        excess = max(0.0, value * value - e_in * e_in)
        if pos.axis in SCALE_AXES:
            scale_excess = max(scale_excess, excess)
            scale_axes += 1
        else:
            other_excess += excess
        words.append(why)
    if scale_axes > 1:
        words.append("TPP and N both off: one distance, counted once (the larger of their errors)")
    return (math.sqrt(e_in * e_in + scale_excess + other_excess) if measured else None), words, unmeasured
