"""Learning-rate schedules as functions of the training fraction t̂ ∈ [0, 1].

Every schedule is peak-normalised: it returns the multiplier η(t̂)/η_peak ∈ [0, 1].
This module is the single definition shared by the predictor (whose surrogate evaluates
η(t̂), paper Eq. 4) and by the trainer (which multiplies each parameter group's peak LR by
it). It lives in ``predictors``, the lowest layer, so the trainer imports it and not the
other way round; it imports numpy only, never torch.

Schedules (all but ``logged`` start with a linear warmup from 0 to 1 over ``warmup_fraction``;
``final_fraction`` f is the floor η(1)/η_peak the decay reaches at t̂ = 1):

* ``linear``     -- linear decay to the floor (f = 0: "D2Z", the paper's schedule and our default).
* ``constant``   -- stays at the peak.
* ``cosine``     -- half-cosine decay to the floor: f + (1 - f)·½(1 + cos πp).
* ``wsd``        -- warmup-stable-decay: constant, then a cooldown to the floor over the final
                    ``decay_fraction`` of training, of shape ``decay_shape``: ``linear`` 1 - p or
                    ``sqrt`` 1 - √p (the "1-sqrt" cooldown of Hägele et al. 2024).
* ``linear_10x`` -- linear decay to 0.1 of the peak ("10× decay", paper App. B.4); the same as
                    ``linear`` with ``final_fraction`` 0.1 (the name is kept for older files).
* ``logged``     -- the learning rate a run logged (``points``), peak-normalised by its maximum,
                    piecewise-linear between the knots and flat beyond them (warmup included).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional, Sequence

import numpy as np

#: The schedules given by a formula (what a trainer config can name).
NamedSchedule = Literal["linear", "constant", "cosine", "wsd", "linear_10x"]
NAMED_SCHEDULES: tuple[str, ...] = ("linear", "constant", "cosine", "wsd", "linear_10x")
#: Every schedule name: the named ones and ``logged`` (a schedule read from a run's logged LR).
ScheduleName = Literal["linear", "constant", "cosine", "wsd", "linear_10x", "logged"]
SCHEDULE_NAMES: tuple[str, ...] = NAMED_SCHEDULES + ("logged",)
DecayShape = Literal["linear", "sqrt"]
DECAY_SHAPES: tuple[str, ...] = ("linear", "sqrt")
#: The floor of ``linear_10x``.
LINEAR_10X_FLOOR = 0.1
#: Two schedules whose fractions differ by at most this are the same schedule (:meth:`Schedule.same_as`).
FRACTION_TOLERANCE = 0.005
#: Fractions estimated by :meth:`Schedule.from_logged` are rounded to this many decimals (float
#: noise of the division off, every fraction of a step count kept).
_ESTIMATE_DECIMALS = 6
#: A logged LR within this (relative) of its maximum is at the peak.
_AT_PEAK = 1e-6
#: Errors within this of the best one are a tie (float32 logging noise is ~1e-7 of the peak).
_TIE = 1e-6

LoggedPoints = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class Schedule:
    """A peak-normalised LR schedule over the training fraction.

    Args:
        name: one of ``SCHEDULE_NAMES``.
        warmup_fraction: fraction of training spent in linear warmup, in [0, 1). For
            ``logged`` the points hold the warmup; the field then only tells the monitor where
            the warmup ends (:meth:`from_logged` estimates it).
        decay_fraction: for ``wsd`` only, the final fraction of training spent decaying,
            in (0, 1 - warmup_fraction].
        final_fraction: the floor η(1)/η_peak the decay of ``linear``, ``cosine`` and ``wsd``
            reaches at t̂ = 1, in [0, 1). ``linear_10x`` has its own floor (0.1): give 0 or 0.1.
        decay_shape: for ``wsd`` only, the cooldown's shape over its progress p ∈ [0, 1]:
            ``linear`` (1 - p) or ``sqrt`` (1 - √p), both scaled to end at the floor.
        points: for ``logged`` only (required there), ``(t̂ knots, LR values)``: knots
            strictly increasing in [0, 1], values finite and >= 0 with a maximum > 0. They are
            stored peak-normalised (values / max), so η at each knot is exactly logged / max
            and two logs of one schedule at different peaks are the same schedule.
    """

    name: ScheduleName = "linear"
    warmup_fraction: float = 0.1
    decay_fraction: float = 0.2
    final_fraction: float = 0.0
    decay_shape: DecayShape = "linear"
    points: Optional[LoggedPoints] = None

    def __post_init__(self) -> None:
        if self.name not in SCHEDULE_NAMES:
            raise ValueError(f"schedule: unknown name {self.name!r}; expected one of {SCHEDULE_NAMES}")
        if not (0.0 <= self.warmup_fraction < 1.0) or not math.isfinite(self.warmup_fraction):
            raise ValueError(f"warmup_fraction: {self.warmup_fraction} is outside [0, 1)")
        if self.name == "wsd" and not (0.0 < self.decay_fraction <= 1.0 - self.warmup_fraction):
            raise ValueError(
                f"decay_fraction: {self.decay_fraction} must be in (0, 1 - warmup_fraction]"
            )
        final = self.final_fraction
        if not isinstance(final, (int, float)) or not math.isfinite(final) or not (0.0 <= final < 1.0):
            raise ValueError(f"final_fraction: {final!r} is outside [0, 1)")
        if self.name == "linear_10x" and final not in (0.0, LINEAR_10X_FLOOR):
            raise ValueError(f"final_fraction: linear_10x decays to {LINEAR_10X_FLOOR} of the peak, got {final!r}; "
                             "use schedule 'linear' with final_fraction for another floor")
        if self.decay_shape not in DECAY_SHAPES:
            raise ValueError(f"decay_shape: unknown shape {self.decay_shape!r}; expected one of {DECAY_SHAPES}")
        if self.name == "logged":
            object.__setattr__(self, "points", _normalised_points(self.points))
        elif self.points is not None:
            raise ValueError(f"points: only a 'logged' schedule has points, not {self.name!r}")

    def __call__(self, t_hat: Any) -> np.ndarray:
        """Return η(t̂)/η_peak for a scalar or array of training fractions."""
        t = np.clip(np.asarray(t_hat, dtype=np.float64), 0.0, 1.0)
        if self.name == "logged":
            knots, values = self.points  # type: ignore[misc]
            return np.interp(t, knots, values)
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
            decay = 1.0 - (1.0 - LINEAR_10X_FLOOR) * after
        else:  # wsd
            start = 1.0 - self.decay_fraction
            if self.decay_shape == "sqrt":
                # Progress p through the cooldown, over 1 - start rather than decay_fraction so
                # that it is exactly 0 at the start (η stays 1) and exactly 1 at t̂ = 1.
                decay = 1.0 - np.sqrt(np.clip((t - start) / (1.0 - start), 0.0, 1.0))
            else:
                # The remaining fraction of the cooldown, 1 - p (written so, as it always was).
                decay = np.clip((1.0 - t) / self.decay_fraction, 0.0, 1.0)
            decay = np.where(t < start, 1.0, decay)
        f = self.final_fraction
        if f and self.name in ("linear", "cosine", "wsd"):
            # Scaled to end at the floor (skipped for f = 0, so those values stay bit for bit).
            decay = f + (1.0 - f) * decay
        return np.where(t < w, warm, decay)

    def at(self, t_hat: float) -> float:
        """Scalar convenience wrapper used in the training loop."""
        return float(self(t_hat))

    @property
    def floor(self) -> float:
        """The floor η(1)/η_peak of the decay: ``final_fraction``, 0.1 for ``linear_10x``."""
        return LINEAR_10X_FLOOR if self.name == "linear_10x" else float(self.final_fraction)

    def shape_key(self) -> tuple[Any, ...]:
        """What determines η(t̂): the fields that matter for this schedule, ``linear_10x`` as
        ``linear`` to 0.1. Two schedules with equal keys (fractions within
        ``FRACTION_TOLERANCE``: :meth:`same_as`) are one schedule."""
        if self.name == "logged":
            return ("logged", self.points)
        name = "linear" if self.name == "linear_10x" else self.name
        key: tuple[Any, ...] = (name, float(self.warmup_fraction))
        if name != "constant":
            key += (self.floor,)
        if name == "wsd":
            key += (float(self.decay_fraction), self.decay_shape)
        return key

    def same_as(self, other: "Schedule", tolerance: float = FRACTION_TOLERANCE) -> bool:
        """Whether ``other`` is the same schedule: equal in every field that shapes η(t̂) (name,
        warmup, floor, and for ``wsd`` the decay fraction and shape; for ``logged`` the points),
        fractions within ``tolerance``. Fields a schedule does not use (a cosine's
        ``decay_fraction``) are not compared."""
        a, b = self.shape_key(), other.shape_key()
        if a[0] != b[0] or len(a) != len(b):
            return False
        if a[0] == "logged":
            return a == b
        return all(abs(x - y) <= tolerance if isinstance(x, float) else x == y for x, y in zip(a[1:], b[1:]))

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``points`` (as two lists) only for a logged schedule."""
        out = asdict(self)
        if self.points is None:
            del out["points"]
        else:
            out["points"] = [list(self.points[0]), list(self.points[1])]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Schedule":
        """Inverse of :meth:`to_dict`; a dict written before ``final_fraction``, ``decay_shape``
        and ``points`` existed loads with their defaults."""
        return cls(**data)

    @classmethod
    def from_logged(cls, t_hat: Sequence[float], lr: Sequence[float], tolerance: float = 0.01) -> "Schedule":
        """The named schedule that reproduces a run's logged learning rate, else a ``logged`` one.

        Rule (``y`` = lr / max(lr), the logged values peak-normalised; a knot at t̂ = 1 is left
        out: the LR logged at the last step is never applied):

        1. warmup: the LR first reaches its peak at knot ``i``. When a knot ``k < i`` with
           ``y > 0`` lies inside the warmup, the warmup is the line from (0, 0) through the last
           such knot (``t_k / y_k``); else it is ``t_i``. Both are tried.
        2. decay start: the last knot at the peak ``j`` (``y >= 1 - 1e-6``); the decay of
           ``wsd`` starts after it. From the first falling knot ``a`` and the last knot ``b``,
           1 - y = (1 - f)·p^k (k = 1 linear, ½ sqrt) gives the start exactly:
           ``(p_a / p_b) = ((1 - y_a) / (1 - y_b))^(1/k)`` with p = (t - s)/(1 - s), and then the
           floor f at t̂ = 1 (extrapolated when the last knot is before the end).
        3. floor of ``linear`` and ``cosine``: the last knot's value solved for f
           (y = f + (1 - f)·g(p)), i.e. extrapolated to t̂ = 1.
        4. candidates, in this order: ``constant``, ``linear``, ``cosine``, ``wsd`` linear, ``wsd``
           sqrt; the one with the smallest largest error |η(t̂) - y| over the knots after its
           warmup (a warmup's own shape is not judged) wins if that
           error is at most ``tolerance`` (earlier in the order on a tie, so a WSD decaying
           over the whole run is ``linear``). Estimated fractions are rounded to 6 decimals.
        5. none fits: ``Schedule("logged", warmup_fraction=<1.>, points=(t_hat, lr))``.

        The peak must be among the logged points: a log that skips it (a warmup ending between
        two points) is normalised by a lower maximum, and may come back as another named
        schedule within ``tolerance`` or as ``logged``.

        Example:
            >>> import numpy as np
            >>> t = np.linspace(0, 1, 101)
            >>> Schedule.from_logged(t, 3e-4 * Schedule("cosine", 0.05, final_fraction=0.1)(t))
            Schedule(name='cosine', warmup_fraction=0.05, decay_fraction=0.2, final_fraction=0.1, decay_shape='linear', points=None)
            >>> s = Schedule.from_logged(t, Schedule("wsd", 0.02, 0.2, decay_shape="sqrt")(t))
            >>> s.name, s.warmup_fraction, s.decay_fraction, s.final_fraction, s.decay_shape
            ('wsd', 0.02, 0.2, 0.0, 'sqrt')
            >>> Schedule.from_logged([0, 0.5, 1], [1, 0.3, 0.9]).name
            'logged'
        """
        knots, values = _normalised_points((tuple(np.asarray(t_hat, dtype=float).ravel()),
                                            tuple(np.asarray(lr, dtype=float).ravel())))
        t, y = np.asarray(knots), np.asarray(values)
        # The LR a trainer logs at its last step (t̂ = 1) is never applied to an update: a
        # constant-LR run that sets it to zero there is constant, not a WSD of 0.1%.
        applied = t < 1.0 - 1e-9
        if applied.sum() >= 2:
            t, y = t[applied], y[applied]
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance: must be a finite number >= 0, got {tolerance!r}")
        at_peak = np.flatnonzero(y >= 1.0 - _AT_PEAK)
        first, last = int(at_peak[0]), int(at_peak[-1])
        warmups = []
        if first > 0 and y[first - 1] > 0:
            warmups.append(t[first - 1] / y[first - 1])
        elif first == 0:
            warmups.append(0.0)  # logged at the peak from its first knot: nothing shows a warmup
        warmups.append(t[first])
        candidates: list[Schedule] = []
        for w in dict.fromkeys(_rounded(x) for x in warmups):
            candidates += _candidates(w, t, y, last)
        # Judged after each candidate's warmup: trainers warm up in shapes of their own (linear,
        # cosine, from a floor), over a few % of training the fit ignores (t̂ < 0.05), while the
        # decay shape is what the surrogate's η(t̂) must get right.
        errors = [float(np.max(np.abs(candidate(t) - y)[t >= candidate.warmup_fraction], initial=0.0))
                  for candidate in candidates]
        if errors and min(errors) <= tolerance:
            # The first in the order within float noise of the best: one function written two
            # ways (a WSD decaying from the end of its warmup is linear) keeps the simpler name.
            return next(c for c, e in zip(candidates, errors) if e <= min(errors) + _TIE)
        return cls("logged", warmup_fraction=logged_warmup(knots, values), points=(knots, values))


def logged_warmup(t_hat: Sequence[float], lr: Sequence[float]) -> float:
    """The warmup of a logged LR: the t̂ where it first reaches its maximum (rounded to 6
    decimals, below 1), what a ``logged`` schedule's ``warmup_fraction`` holds when not given.

    >>> logged_warmup([0, 0.05, 0.1, 0.5, 1], [0, 5e-4, 1e-3, 1e-3, 0])
    0.1
    """
    t, y = np.asarray(t_hat, dtype=np.float64), np.asarray(lr, dtype=np.float64)
    first = int(np.flatnonzero(y >= y.max() * (1.0 - _AT_PEAK))[0])
    return min(_rounded(t[first]), 1.0 - 1e-6)


def _rounded(x: float) -> float:
    return round(float(x), _ESTIMATE_DECIMALS)


def _fraction(x: float) -> float:
    """An estimated floor, rounded and clipped to [0, 1) (+ 0.0: no -0.0 in a file)."""
    return min(max(_rounded(x), 0.0), 1.0 - 1e-6) + 0.0


def _floor_from(y: float, g: float) -> float:
    """f with y = f + (1 - f)·g (the last knot's value solved for the floor), clipped to [0, 1)."""
    f = (y - g) / (1.0 - g) if g < 1.0 else y
    return _fraction(f)


def _candidates(w: float, t: np.ndarray, y: np.ndarray, last_peak: int) -> list[Schedule]:
    """The named schedules with warmup ``w`` that :meth:`Schedule.from_logged` tries, in order."""
    if not (0.0 <= w < 1.0):
        return []
    out = [Schedule("constant", w)]
    tb, yb = float(t[-1]), float(y[-1])
    p = (tb - w) / (1.0 - w)
    if tb > w:
        out.append(Schedule("linear", w, final_fraction=_floor_from(yb, 1.0 - p)))
        out.append(Schedule("cosine", w, final_fraction=_floor_from(yb, 0.5 * (1.0 + math.cos(math.pi * p)))))
    falling = np.flatnonzero((np.arange(t.size) > last_peak) & (y < 1.0 - _AT_PEAK))
    for shape, k in (("linear", 1.0), ("sqrt", 0.5)):
        if falling.size == 0:
            break
        a = int(falling[0])
        ta, ya = float(t[a]), float(y[a])
        if falling.size >= 2 and yb < ya:
            q = ((1.0 - ya) / (1.0 - yb)) ** (1.0 / k)  # p_a / p_b
            start = (ta - q * tb) / (1.0 - q)
            pb = (tb - start) / (1.0 - start)
            final = 1.0 - (1.0 - yb) / pb ** k if pb > 0 else yb
        else:  # one falling knot: the decay starts at the last knot at the peak
            start, final = float(t[last_peak]), yb
        start = max(_rounded(start), w)
        final = _fraction(final)
        try:
            out.append(Schedule("wsd", w, _rounded(1.0 - start), final_fraction=final, decay_shape=shape))  # type: ignore[arg-type]
        except ValueError:
            continue  # a start before the warmup ends: not a WSD
    return out


def _normalised_points(points: Any) -> LoggedPoints:
    """``points`` checked (ValueError naming the field) and peak-normalised, as tuples."""
    if points is None:
        raise ValueError("points: a 'logged' schedule needs points (t̂ knots, LR values)")
    try:
        knots, values = (np.asarray(p, dtype=np.float64).ravel() for p in points)
    except (TypeError, ValueError):
        raise ValueError(f"points: must be two sequences of numbers (t̂ knots, LR values), got {points!r}"[:300]) from None
    if knots.size < 2 or knots.size != values.size:
        raise ValueError(f"points: needs >= 2 knots and one LR value per knot, got {knots.size} knots and {values.size} values")
    if not (np.all(np.isfinite(knots)) and np.all(np.isfinite(values))):
        raise ValueError("points: knots and LR values must be finite")
    if knots[0] < 0.0 or knots[-1] > 1.0 or np.any(np.diff(knots) <= 0):
        raise ValueError("points: t̂ knots must increase strictly inside [0, 1]")
    peak = float(values.max())
    if np.any(values < 0) or peak <= 0:
        raise ValueError("points: LR values must be >= 0 with a maximum > 0")
    return tuple(float(x) for x in knots), tuple(float(v) for v in values / peak)
