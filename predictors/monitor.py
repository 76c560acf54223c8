"""The collapse-residual monitor (paper §4): does a run still have the shape it should have?

A run's curve is compared with a reference normalised curve ℓ_ref (the predictor's ℓ̂ for the
run's controls, or the normalised curve of a reference run with the same τ, TPP and schedule):

    r(t̂) = L(t̂) / (L̂(T)·ℓ_ref(t̂)) − 1

where L̂(T) is the divisor that aligns the run with ℓ_ref over an **early alignment window**
(``predictors.align.align_divisor``, the predictor's objective). A healthy run keeps r inside a
noise band c(t̂) ± σ(t̂) measured on clean calibration runs (:func:`calibrate_band`; stored in
the predictor JSON under ``monitor``); a drift, a step or a bug moves r out of it while the
raw loss still falls.

Choices (stated, and tested in tests/test_monitor.py):

* **Alignment window** ``MONITOR_WINDOW = (0.15, 0.30)``, not the paper's 25–50%: the window
  must end before the fault it is meant to catch (a fault inside the window moves L̂(T) with it
  and hides in r), and the benchmark's drifts start at t̂ 0.3–0.6. It starts after the warmup:
  with a warmup fraction w the window is ``[max(0.15, w + 0.05), max(0.30, start + 0.15)]``.
  A fault that starts before the window ends is not what this monitor catches.
* **Detector** (:class:`DetectorRule`): a point is *out of band* when
  |r − c(t̂)| > z·σ(t̂) (σ floored at ``min_scale``); an **alarm** is raised at the first point at
  which the run has been out of band on the same side at every judged point over a stretch of
  at least ``span`` in t̂ (default z = 4, span 0.05: 2.5 smoothing windows of the trainer's 2%,
  so a one-window blip never alarms). Only points after the alignment window are judged.
* **Warmup, restarts, micro-batch changes**: points before the window end (the warmup
  included) are never judged. Marked change points (a restart from a checkpoint, a new
  micro-batch size: ``restarts``) open a grace of ``restart_grace`` in t̂ whose points are
  neither judged nor aligned on, and they break a stretch in progress: the transient of the
  trailing-mean smoother and of the resumed optimizer is not a fault.

The monitor sees a run's smoothed loss (the trainer's trailing mean, what the scheduler sees);
it uses the paper's L̂ = 0 normalisation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from predictors.align import reference_at, window_divisor
from predictors.controls import Controls
from predictors.normalize import check_curve

#: The early alignment window (t̂) before the warmup shift: ends before the faults it should catch.
MONITOR_WINDOW = (0.15, 0.30)
#: The window starts this far after the end of the warmup, and is at least WINDOW_MIN_WIDTH wide.
WARMUP_GAP = 0.05
WINDOW_MIN_WIDTH = 0.15
#: Where the noise band is measured (t̂ from the window end to the end of training).
BAND_GRID = tuple(float(x) for x in np.round(np.arange(0.30, 1.0 + 1e-9, 0.025), 4))
BAND_SCHEMA = "collapse-hpo/monitor-band"


def alignment_window(warmup_fraction: float = 0.0, window: Sequence[float] = MONITOR_WINDOW) -> tuple[float, float]:
    """The alignment window for a run with this warmup (module docstring)."""
    w = float(warmup_fraction)
    if not (math.isfinite(w) and 0.0 <= w < 1.0):
        raise ValueError(f"warmup_fraction: must be in [0, 1), got {warmup_fraction!r}")
    start = max(float(window[0]), round(w + WARMUP_GAP, 9))
    end = max(float(window[1]), round(start + WINDOW_MIN_WIDTH, 9))
    if end >= 1.0:
        raise ValueError(f"monitor: a warmup of {w:g} leaves no alignment window before the end of training")
    return start, end


@dataclass(frozen=True)
class DetectorRule:
    """When the residual has left its band in a sustained way (module docstring).

    Args:
        z: out of band when |r − c| > z·σ.
        span: the stretch of t̂ a run must stay out of band (same side, every judged point).
        min_scale: floor on σ (relative), so a band measured on very few runs is never ~0.
        restart_grace: t̂ after a marked restart or micro-batch change that is not judged.
    """

    z: float = 4.0
    span: float = 0.05
    min_scale: float = 0.002
    restart_grace: float = 0.05

    def __post_init__(self) -> None:
        for name in ("z", "span", "min_scale", "restart_grace"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"monitor rule: {name} must be a finite number >= 0, got {value!r}")
        if self.z <= 0:
            raise ValueError(f"monitor rule: z must be > 0, got {self.z!r}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class NoiseBand:
    """c(t̂) ± σ(t̂) of the residual of clean runs, on a t̂ grid (held constant beyond its ends).

    Attributes:
        t_hat, center, scale: the grid, the mean residual there and the RMS about it.
        n_curves: clean runs it was measured on.
        window: the alignment window (before the warmup shift) the residuals used.
        rule: the detector rule that goes with it.
        source: what it was measured on, in words.
    """

    t_hat: tuple[float, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    n_curves: int
    window: tuple[float, float] = MONITOR_WINDOW
    rule: DetectorRule = field(default_factory=DetectorRule)
    source: str = ""

    def __post_init__(self) -> None:
        t = np.asarray(self.t_hat, dtype=float)
        if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
            raise ValueError("monitor band: t_hat must be a non-empty, strictly increasing list of fractions")
        for name in ("center", "scale"):
            values = np.asarray(getattr(self, name), dtype=float)
            if values.shape != t.shape or not np.all(np.isfinite(values)):
                raise ValueError(f"monitor band: {name} must hold one finite number per t_hat")
        if np.any(np.asarray(self.scale) < 0):
            raise ValueError("monitor band: scale must be >= 0")
        lo, hi = self.window
        if not (0.0 <= lo < hi < 1.0):
            raise ValueError(f"monitor band: window must satisfy 0 <= start < end < 1, got {self.window}")

    def at(self, t_hat: Any) -> tuple[np.ndarray, np.ndarray]:
        """(c, σ) at ``t_hat`` (linear between grid points, σ floored at the rule's min_scale)."""
        t = np.asarray(t_hat, dtype=float)
        center = np.interp(t, self.t_hat, self.center)
        scale = np.maximum(np.interp(t, self.t_hat, self.scale), self.rule.min_scale)
        return center, scale

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": BAND_SCHEMA,
            "t_hat": [float(x) for x in self.t_hat],
            "center": [float(x) for x in self.center],
            "scale": [float(x) for x in self.scale],
            "statistic": "mean and RMS about it of r(t̂) over clean runs",
            "n_curves": int(self.n_curves),
            "window": [float(x) for x in self.window],
            "rule": self.rule.to_dict(),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "monitor") -> "NoiseBand":
        """Validate a ``monitor`` section (as :meth:`to_dict` writes it); ``ValueError`` naming the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: the monitor section must be a mapping")
        known = {"schema", "t_hat", "center", "scale", "statistic", "n_curves", "window", "rule", "source"}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"{source}: monitor: unknown field(s) {', '.join(extra)}")
        if data.get("schema") != BAND_SCHEMA:
            raise ValueError(f"{source}: monitor.schema must be {BAND_SCHEMA!r}")
        try:
            rule_data = data.get("rule") or {}
            if not isinstance(rule_data, Mapping):
                raise ValueError("monitor.rule must be a mapping")
            window = data.get("window", list(MONITOR_WINDOW))
            return cls(
                tuple(float(x) for x in data["t_hat"]),
                tuple(float(x) for x in data["center"]),
                tuple(float(x) for x in data["scale"]),
                int(data.get("n_curves", 0)),
                (float(window[0]), float(window[1])),
                DetectorRule(**{k: float(v) for k, v in rule_data.items()}),
                str(data.get("source", "")),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{source}: monitor: missing or malformed field {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None


#: The band a predictor without a ``monitor`` section falls back to: flat ±1% (stated as uncalibrated).
UNCALIBRATED_BAND = NoiseBand(BAND_GRID[:1], (0.0,), (0.01,), 0, source="uncalibrated: flat 1% (run hpo calibrate)")


@dataclass(frozen=True)
class MonitorResult:
    """The residual of one run and the detector's verdict.

    Attributes:
        t_hat, residual: every point the reference covers and r there.
        z: (r − c)/σ at those points (NaN where not judged).
        judged: which points the detector judged (after the window, outside restart graces).
        final_loss: L̂(T), the early-align divisor (NaN while the run is still before the window end).
        window: the alignment window used.
        status: ``"aligning"`` (not past the window end yet), ``"ok"`` or ``"alarm"``.
        first_alarm: t̂ at which the alarm was raised (the point completing the stretch), or None.
        exceed_since: t̂ where that out-of-band stretch began, or None.
        direction: ``"above"`` (loss higher than the shape says) or ``"below"``, or None.
    """

    t_hat: np.ndarray
    residual: np.ndarray
    z: np.ndarray
    judged: np.ndarray
    final_loss: float
    window: tuple[float, float]
    status: str
    first_alarm: Optional[float] = None
    exceed_since: Optional[float] = None
    direction: Optional[str] = None

    @property
    def alarm(self) -> bool:
        return self.status == "alarm"

    @property
    def last_residual(self) -> Optional[float]:
        """r at the newest point past the window end (None before it)."""
        return float(self.residual[-1]) if self.status != "aligning" and self.residual.size else None


def grace_mask(t: np.ndarray, restarts: Iterable[float], grace: float) -> np.ndarray:
    """True at the points within ``grace`` after a marked restart / micro-batch change."""
    mask = np.zeros(t.size, dtype=bool)
    for r in restarts:
        r = float(r)
        if not math.isfinite(r):
            raise ValueError(f"restarts: must be finite training fractions, got {r!r}")
        mask |= (t >= r) & (t <= r + grace)
    return mask


def monitor_curve(
    t_hat: Any,
    loss: Any,
    reference: Any,
    controls: Optional[Controls] = None,
    *,
    band: NoiseBand = UNCALIBRATED_BAND,
    restarts: Sequence[float] = (),
    objective: str = "log",
) -> MonitorResult:
    """The residual r(t̂) of a (partial) run and the detector's verdict on it.

    ``reference``: a Predictor (then ``controls`` are the run's τ, TPP and schedule) or a
    reference normalised curve (a ``Curve`` or a ``(t̂, ℓ)`` pair; see
    ``predictors.align.reference_at``). The warmup comes from ``controls`` when given.
    ``restarts``: t̂ of marked restarts and micro-batch changes. Raises ``ValueError`` on bad
    input (non-finite or non-positive losses, t̂ not increasing in [0, 1], a reference that
    covers fewer than 2 points of the window once the run has passed it).

    Example:
        A run on its reference shape is ok; the same run drifting up to +5% from t̂ = 0.5 alarms
        once r has stayed above 4σ (the flat uncalibrated σ = 1%) for 0.05 of training:

        >>> t = np.linspace(0.01, 1.0, 200)
        >>> ell = 1.0 + 0.5 * (1.0 - t) ** 2
        >>> monitor_curve(t, 2.0 * ell, (t, ell)).status
        'ok'
        >>> r = monitor_curve(t, 2.0 * ell * (1 + 0.05 * np.clip((t - 0.5) / 0.5, 0, 1)), (t, ell))
        >>> r.status, round(r.first_alarm, 2)
        ('alarm', 0.96)
    """
    t, y = check_curve(t_hat, loss, min_points=1, name="monitor: run")
    rule = band.rule
    warmup = float(controls.schedule.warmup_fraction) if controls is not None else 0.0
    lo, hi = alignment_window(warmup, band.window)
    inside, ell = reference_at(t, reference, controls, name="monitor")
    t, y = t[inside], y[inside]
    grace = grace_mask(t, restarts, rule.restart_grace)
    nan = np.full(t.size, np.nan)
    if t.size == 0 or t[-1] < hi:
        return MonitorResult(t, nan, nan, np.zeros(t.size, dtype=bool), math.nan, (lo, hi), "aligning")
    in_window = (t >= lo) & (t <= hi) & ~grace
    divisor = window_divisor(y, ell, in_window, (lo, hi), objective, "monitor",
                             "covered by the reference, outside restart graces")
    r = y / (divisor * ell) - 1.0
    judged = (t > hi) & ~grace
    center, scale = band.at(t)
    z = np.where(judged, (r - center) / scale, np.nan)
    first, since, side = _first_alarm(t, z, judged, rule)
    return MonitorResult(t, r, z, judged, divisor, (lo, hi), "alarm" if first is not None else "ok",
                         first, since, side)


def _first_alarm(t: np.ndarray, z: np.ndarray, judged: np.ndarray, rule: DetectorRule
                 ) -> tuple[Optional[float], Optional[float], Optional[str]]:
    """The sustained-exceedance rule: (alarm t̂, stretch start, side) or (None, None, None)."""
    start: Optional[int] = None
    sign = 0
    for i in range(t.size):
        if not judged[i]:
            start, sign = None, 0  # a restart grace breaks a stretch
            continue
        s = 1 if z[i] > rule.z else (-1 if z[i] < -rule.z else 0)
        if s == 0:
            start, sign = None, 0
            continue
        if s != sign:
            start, sign = i, s
        assert start is not None
        if i > start and t[i] - t[start] >= rule.span:
            return float(t[i]), float(t[start]), "above" if sign > 0 else "below"
    return None, None, None


def band_residuals(
    curves: Sequence[Any], reference: Any, *, window: Sequence[float] = MONITOR_WINDOW,
    grid: Sequence[float] = BAND_GRID, objective: str = "log",
) -> np.ndarray:
    """r(t̂) of each complete clean curve (``predictors.Curve``) on ``grid``: shape (runs, grid).

    ``reference`` is a Predictor (each curve's controls, with N from its meta) or a callable
    ``curve -> reference`` (for reference curves of matching controls). Curves the reference
    does not cover on the whole grid are skipped.
    """
    from predictors.curves import controls_with_size

    g = np.asarray(grid, dtype=float)
    band = NoiseBand(tuple(g), tuple(np.zeros(g.size)), tuple(np.ones(g.size)), 0, tuple(window))  # type: ignore[arg-type]
    rows = []
    for curve in curves:
        controls = controls_with_size(curve)
        ref = reference(curve) if callable(reference) and not hasattr(reference, "normalized_curve") else reference
        if ref is None:
            continue
        result = monitor_curve(curve.t_hat, curve.loss, ref, controls, band=band, objective=objective)
        if result.status == "aligning" or result.t_hat[0] > g[0] or result.t_hat[-1] < g[-1] - 0.01:
            continue
        rows.append(np.interp(g, result.t_hat, result.residual))
    return np.asarray(rows, dtype=float).reshape(len(rows), g.size)


def calibrate_band(
    curves: Sequence[Any], reference: Any, *, rule: DetectorRule = DetectorRule(),
    window: Sequence[float] = MONITOR_WINDOW, grid: Sequence[float] = BAND_GRID, source: str = "",
    objective: str = "log",
) -> NoiseBand:
    """The noise band of r(t̂) over clean complete runs: mean and RMS about it on ``grid``.

    Raises ``ValueError`` when fewer than 3 curves are covered (a spread needs several runs).
    """
    residuals = band_residuals(curves, reference, window=window, grid=grid, objective=objective)
    if residuals.shape[0] < 3:
        raise ValueError(f"monitor band: needs at least 3 clean complete curves, got {residuals.shape[0]}")
    center = residuals.mean(axis=0)
    scale = np.sqrt(((residuals - center) ** 2).mean(axis=0))
    return NoiseBand(tuple(float(x) for x in grid), tuple(float(x) for x in np.round(center, 6)),
                     tuple(float(x) for x in np.round(scale, 6)), int(residuals.shape[0]),
                     (float(window[0]), float(window[1])), rule, source)
