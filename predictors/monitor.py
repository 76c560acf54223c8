"""The collapse-residual monitor (paper §4): does a run still have the shape it should have?

A run's curve is compared with a reference normalised curve ℓ_ref (the predictor's ℓ̂ for the
run's controls, or the normalised curve of reference runs with the same τ, TPP and schedule):

    r(t̂) = L(t̂) / (L̂(T)·ℓ_ref(t̂)) − 1

where L̂(T) is the divisor that aligns the run with ℓ_ref over an **early alignment window**
(``predictors.align.align_divisor``, the predictor's objective). What is judged is the
residual's **change after the window**, not its level:

    d(t̂) = r̄(t̂) − r̄_w

with r̄(t̂) the mean of r over the trailing ``smoothing`` of t̂ (0.05) and r̄_w the mean of r over
the last ``level_span`` (0.05) of the window. A seed's level offset, or a run whose shape is
slightly off from the start, leaves d ≈ 0; a residual that grows after the window does not.
A healthy run keeps d inside a noise band c(t̂) ± σ(t̂) measured on clean calibration runs
(:func:`calibrate_band`; stored in the predictor JSON under ``monitor``); a drift, a step or a
bug moves it out while the raw loss still falls.

Two bands, for the two kinds of reference (both measured by ``hpo calibrate``):

* **predictor mode**: d of clean runs against the predictor (``hpo calibrate`` uses each run's
  leave-one-out refit, so the band is that of a run the predictor has not seen);
* **reference mode** (:func:`pair_changes`, ``NoiseBand.reference``): d of a clean run against
  a clean run of the same controls and another seed — the variation the reference itself
  brings. Its centre is 0 (a pair is judged both ways). Where a user gives ≥ 2 reference runs of
  a run's controls, :func:`scaled_band` rescales this band's shape to their own spread.

Choices (stated, and tested in tests/test_monitor.py):

* **Alignment window** ``MONITOR_WINDOW = (0.15, 0.30)``, not the paper's 25–50%: the window
  must end before the fault it is meant to catch (a fault inside the window moves L̂(T) with it
  and hides in r), and the benchmark's drifts start at t̂ 0.3–0.6. It starts after the warmup:
  with a warmup fraction w the window is ``[max(0.15, w + 0.05), max(0.30, start + 0.15)]``.
  A fault that starts before the window ends is not what this monitor catches.
* **Detector** (:class:`DetectorRule`): a sequential GLR test for a *ramp* in d — the residual
  growing linearly from an unknown start τ — on z = (d − c)/σ at the band's grid points after
  the window (every 0.025 of t̂, so the test does not depend on how often a run logs). At each
  grid point it takes, over the starts τ (the window end, each earlier grid point), the
  statistic zᵀR⁻¹f_τ/√(f_τᵀR⁻¹f_τ) of the ramp f_τ(t) = (t − τ)₊/σ(t), with R the correlation of
  z between grid points measured on the clean runs (shrunk, (1 − λ)R + λI, λ = 0.3: measured
  on a few dozen runs), and alarms when it passes h. One-sided: only a loss *above* its shape
  alarms (every fault this monitor is for makes the loss worse). ``h`` is set for a stated
  false-alarm rate per run (``false_alarm_rate``, default 0.5%): the (1 − rate) quantile of the
  test's maximum over Gaussian z paths with that correlation (:func:`glr_threshold`). The
  rate holds for Gaussian clean runs; real ones have heavier tails (all trials of one seed
  share a data order, and a hard stretch of data raises them together), so the false alarms
  measured on held-out runs (benchmarks/monitor.md) are the figure to quote. The change point
  reported (``exceed_since``) is the start τ of the ramp that passed h.
* **Warmup, restarts, micro-batch changes**: points before the window end (the warmup
  included) are never judged. Marked change points (a restart from a checkpoint, a new
  micro-batch size: ``restarts``) open a grace of ``restart_grace`` in t̂ whose points are
  neither judged, averaged nor aligned on: the transient of the trailing-mean smoother and of
  the resumed optimizer is not a fault.

The monitor sees a run's smoothed loss (the trainer's trailing mean, what the scheduler sees).
Reference curves use the paper's L̂ = 0 normalisation; a predictor fitted with an irreducible
loss L̂ is followed: its reducible part is aligned and r = L/(L̂ + L̂(T)·ℓ̂) − 1.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import asdict, dataclass, field, replace
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
#: Where the noise band is measured and the detector judges (t̂ from the window end to the end).
BAND_GRID = tuple(float(x) for x in np.round(np.arange(0.30, 1.0 + 1e-9, 0.025), 4))
BAND_SCHEMA = "collapse-hpo/monitor-band/2"
#: The schema of the band of r itself (the sustained-exceedance detector it replaced).
OLD_BAND_SCHEMA = "collapse-hpo/monitor-band"
#: Correlation length (t̂) of z assumed where no clean runs measured it (the uncalibrated band).
DEFAULT_CORRELATION_LENGTH = 0.3
#: Gaussian paths behind a threshold (deterministic seed): ~1% Monte Carlo error at a 1% rate.
THRESHOLD_PATHS = 20_000


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


def ar1_correlation(grid: Sequence[float], length: float = DEFAULT_CORRELATION_LENGTH) -> np.ndarray:
    """corr(z(t), z(s)) = exp(−|t − s|/length) on ``grid``."""
    g = np.asarray(grid, dtype=float)
    return np.exp(-np.abs(g[:, None] - g[None, :]) / float(length))


def shrunk(correlation: np.ndarray, shrinkage: float) -> np.ndarray:
    """(1 − λ)·R + λ·I: a correlation measured on a few dozen runs, made safe to invert."""
    c = np.asarray(correlation, dtype=float)
    return (1.0 - shrinkage) * c + shrinkage * np.eye(c.shape[0])


def ramp_weights(grid: np.ndarray, scale: np.ndarray, correlation: np.ndarray, window_end: float) -> np.ndarray:
    """The GLR weights at the newest of the judged ``grid`` points: column j is R⁻¹f_j/√(f_jᵀR⁻¹f_j)
    for the ramp f_j(t) = (t − τ_j)₊/σ(t) that starts at τ_j (the window end, then each earlier
    judged point), so that zᵀw_j is the ramp's GLR statistic (N(0, 1) under the null)."""
    starts = np.concatenate([[window_end], grid[:-1]])
    f = np.clip(grid[:, None] - starts[None, :], 0.0, None) / scale[:, None]
    w = np.linalg.solve(correlation, f)
    norm = np.sqrt(np.maximum(np.einsum("ij,ij->j", f, w), 1e-300))
    return w / norm


def glr_threshold(false_alarm_rate: float, grid: np.ndarray, scale: np.ndarray, correlation: np.ndarray,
                  window_end: float, shrinkage: float, *, paths: int = THRESHOLD_PATHS, seed: int = 0,
                  spread_dof: Optional[float] = None) -> float:
    """The h at which the sequential ramp GLR (:func:`ramp_glr`, whitening with the ``shrinkage``
    of ``correlation``) alarms on a share ``false_alarm_rate`` of Gaussian z paths with the
    ``correlation`` itself across the judged ``grid`` points, by the end of training: the
    (1 − rate) quantile of its maximum (deterministic ``seed``).

    ``spread_dof``: σ was measured with this many degrees of freedom (a spread of a few
    reference runs, :func:`scaled_band`), so z is divided by an estimate σ̂ with σ̂²/σ² ~ χ²_ν/ν:
    the maximum is multiplied by √(ν/χ²_ν) drawn for each path (a Student-t-like widening;
    None or inf: σ known)."""
    top = _glr_maxima(tuple(float(x) for x in grid), tuple(float(x) for x in scale),
                      tuple(tuple(float(x) for x in row) for row in np.asarray(correlation, dtype=float)),
                      float(window_end), float(shrinkage), int(paths), int(seed))
    if spread_dof is not None and math.isfinite(spread_dof):
        if not spread_dof > 0:
            raise ValueError(f"monitor: spread_dof must be > 0, got {spread_dof!r}")
        chi2 = np.random.default_rng(seed + 1).chisquare(float(spread_dof), top.size)
        top = top * np.sqrt(float(spread_dof) / chi2)
    return float(np.round(np.quantile(top, 1.0 - false_alarm_rate), 4))


@functools.lru_cache(maxsize=16)
def _glr_maxima(grid: tuple[float, ...], scale: tuple[float, ...], correlation: tuple[tuple[float, ...], ...],
                window_end: float, shrinkage: float, paths: int, seed: int) -> np.ndarray:
    """The ramp GLR's maximum over each of ``paths`` Gaussian z paths (:func:`glr_threshold`);
    cached: every run judged with one band shares it."""
    g, sc, c = np.asarray(grid), np.asarray(scale), np.asarray(correlation)
    w, v = np.linalg.eigh((c + c.T) / 2.0)
    z = np.random.default_rng(seed).standard_normal((paths, c.shape[0])) @ (v * np.sqrt(np.clip(w, 0.0, None))).T
    whitening = shrunk(c, shrinkage)
    top = np.full(z.shape[0], -np.inf)
    for m in range(1, g.size + 1):
        weights = ramp_weights(g[:m], sc[:m], whitening[:m, :m], window_end)
        top = np.maximum(top, (z[:, :m] @ weights).max(axis=1))
    top.setflags(write=False)
    return top


@dataclass(frozen=True)
class DetectorRule:
    """The sequential ramp GLR on the change of the residual (module docstring).

    Args:
        false_alarm_rate: the stated share of clean runs alarmed (per run, to the end of training).
        h: the alarm threshold on the GLR statistic; None: set for ``false_alarm_rate`` under an
            AR(1) correlation of length 0.3 and a flat σ (``hpo calibrate`` sets it from the
            band's measured σ and correlation).
        shrinkage: λ of the correlation (1 − λ)·R + λ·I the GLR whitens with.
        smoothing: r is averaged over this trailing stretch of t̂ before it is judged.
        level_span: the level r̄_w is r averaged over the last ``level_span`` of the window.
        min_scale: floor on σ (relative), so a band measured on very few runs is never ~0.
        restart_grace: t̂ after a marked restart or micro-batch change that is not judged.
    """

    false_alarm_rate: float = 0.005
    h: Optional[float] = None
    shrinkage: float = 0.3
    smoothing: float = 0.05
    level_span: float = 0.05
    min_scale: float = 0.002
    restart_grace: float = 0.05

    def __post_init__(self) -> None:
        for name in ("shrinkage", "smoothing", "level_span", "min_scale", "restart_grace"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"monitor rule: {name} must be a finite number >= 0, got {value!r}")
        rate = self.false_alarm_rate
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not (0.0 < rate < 0.5):
            raise ValueError(f"monitor rule: false_alarm_rate must be in (0, 0.5), got {rate!r}")
        if self.smoothing <= 0 or self.level_span <= 0 or self.shrinkage > 1:
            raise ValueError("monitor rule: smoothing and level_span must be > 0, shrinkage in [0, 1]")
        if self.h is None:
            object.__setattr__(self, "h", _default_threshold(float(rate), float(self.shrinkage)))
        elif not isinstance(self.h, (int, float)) or isinstance(self.h, bool) or not math.isfinite(self.h) or self.h <= 0:
            raise ValueError(f"monitor rule: h must be a finite number > 0, got {self.h!r}")

    @property
    def threshold(self) -> float:
        assert self.h is not None
        return float(self.h)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def describe(self) -> str:
        return (f"ramp GLR on the residual's change after the window, h {self.threshold:.3g} "
                f"(stated false-alarm rate {100 * self.false_alarm_rate:g}% per run)")


#: ``_computed_default_threshold(0.005, 0.3)``, computed once (1–2 s; tests/test_monitor.py checks it).
DEFAULT_THRESHOLD = 3.7091


@functools.lru_cache(maxsize=32)
def _default_threshold(false_alarm_rate: float, shrinkage: float) -> float:
    if (false_alarm_rate, shrinkage) == (0.005, 0.3):
        return DEFAULT_THRESHOLD
    return _computed_default_threshold(false_alarm_rate, shrinkage)


def _computed_default_threshold(false_alarm_rate: float, shrinkage: float) -> float:
    judged = np.asarray([g for g in BAND_GRID if g > MONITOR_WINDOW[1]])
    return glr_threshold(false_alarm_rate, judged, np.ones(judged.size), ar1_correlation(judged),
                         MONITOR_WINDOW[1], shrinkage)


@dataclass(frozen=True)
class NoiseBand:
    """c(t̂) ± σ(t̂) of the change d of the residual of clean runs, on a t̂ grid (held constant
    beyond its ends).

    Attributes:
        t_hat, center, scale: the grid, the mean of d there and the RMS about it.
        n_curves: clean runs it was measured on (for a reference band: ordered pairs of runs).
        window: the alignment window (before the warmup shift) the residuals used.
        rule: the detector rule that goes with it (its h set for this band's correlation).
        source: what it was measured on, in words.
        reference: the reference-mode band (d against a clean run of the same controls and
            another seed; centre 0), or None where the calibration held no such pairs.
        correlation: corr of z between the grid points, measured on the clean runs (rows of
            grid points never judged are those of the identity), or None: an AR(1) of length 0.3.
    """

    t_hat: tuple[float, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    n_curves: int
    window: tuple[float, float] = MONITOR_WINDOW
    rule: DetectorRule = field(default_factory=DetectorRule)
    source: str = ""
    reference: Optional["NoiseBand"] = None
    correlation: Optional[tuple[tuple[float, ...], ...]] = None

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
        if self.reference is not None and self.reference.reference is not None:
            raise ValueError("monitor band: a reference band holds no reference band of its own")
        if self.correlation is not None:
            c = np.asarray(self.correlation, dtype=float)
            if c.shape != (t.size, t.size) or not np.all(np.isfinite(c)) or np.any(np.abs(c) > 1 + 1e-6):
                raise ValueError("monitor band: correlation must be a square matrix of correlations, one row per t_hat")

    def correlation_at(self, grid: np.ndarray) -> np.ndarray:
        """The (shrunk) correlation of z between ``grid`` points, as the detector whitens with."""
        g = np.asarray(grid, dtype=float)
        index = np.searchsorted(self.t_hat, g)
        measured = (self.correlation is not None and bool(np.all(index < len(self.t_hat)))
                    and bool(np.allclose(np.asarray(self.t_hat)[np.minimum(index, len(self.t_hat) - 1)], g)))
        c = np.asarray(self.correlation)[np.ix_(index, index)] if measured else ar1_correlation(g)
        return shrunk(c, self.rule.shrinkage)

    def at(self, t_hat: Any) -> tuple[np.ndarray, np.ndarray]:
        """(c, σ) at ``t_hat`` (linear between grid points, σ floored at the rule's min_scale)."""
        t = np.asarray(t_hat, dtype=float)
        center = np.interp(t, self.t_hat, self.center)
        scale = np.maximum(np.interp(t, self.t_hat, self.scale), self.rule.min_scale)
        return center, scale

    @property
    def for_reference(self) -> "NoiseBand":
        """The band for a run judged against reference curves (not the predictor): the
        reference-mode band where measured, else this one."""
        return self.reference if self.reference is not None else self

    def to_dict(self) -> dict[str, Any]:
        out = {
            "schema": BAND_SCHEMA,
            "t_hat": [float(x) for x in self.t_hat],
            "center": [float(x) for x in self.center],
            "scale": [float(x) for x in self.scale],
            "statistic": "mean and RMS about it of d(t̂) = r̄(t̂) − r̄ at the window end, over clean runs",
            "n_curves": int(self.n_curves),
            "window": [float(x) for x in self.window],
            "rule": self.rule.to_dict(),
            "source": self.source,
        }
        if self.correlation is not None:
            out["correlation"] = [[float(x) for x in row] for row in self.correlation]
        if self.reference is not None:
            out["reference"] = self.reference.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "monitor") -> "NoiseBand":
        """Validate a ``monitor`` section (as :meth:`to_dict` writes it); ``ValueError`` naming the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: the monitor section must be a mapping")
        known = {"schema", "t_hat", "center", "scale", "statistic", "n_curves", "window", "rule", "source",
                 "reference", "correlation"}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"{source}: monitor: unknown field(s) {', '.join(extra)}")
        if data.get("schema") == OLD_BAND_SCHEMA:
            raise ValueError(f"{source}: monitor: a band of the residual itself (written before the detector "
                             "judged its change); rerun hpo calibrate")
        if data.get("schema") != BAND_SCHEMA:
            raise ValueError(f"{source}: monitor.schema must be {BAND_SCHEMA!r}")
        try:
            rule_data = data.get("rule") or {}
            if not isinstance(rule_data, Mapping):
                raise ValueError("monitor.rule must be a mapping")
            window = data.get("window", list(MONITOR_WINDOW))
            reference = data.get("reference")
            correlation = data.get("correlation")
            return cls(
                tuple(float(x) for x in data["t_hat"]),
                tuple(float(x) for x in data["center"]),
                tuple(float(x) for x in data["scale"]),
                int(data.get("n_curves", 0)),
                (float(window[0]), float(window[1])),
                DetectorRule(**{k: (None if v is None else float(v)) for k, v in rule_data.items()}),
                str(data.get("source", "")),
                None if reference is None else cls.from_dict(reference, source=f"{source}.reference"),
                None if correlation is None else tuple(tuple(float(x) for x in row) for row in correlation),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{source}: monitor: missing or malformed field {exc}") from None
        except ValueError as exc:
            message = str(exc)
            raise ValueError(message if message.startswith(source) else f"{source}: {message}") from None


#: The band a predictor without a ``monitor`` section falls back to: flat ±1% (stated as uncalibrated).
UNCALIBRATED_BAND = NoiseBand(BAND_GRID[:1], (0.0,), (0.01,), 0, source="uncalibrated: flat 1% (run hpo calibrate)")


@dataclass(frozen=True)
class MonitorResult:
    """The residual of one run and the detector's verdict.

    Attributes:
        t_hat, residual: every point the reference covers and r there.
        change: d(t̂) = r̄(t̂) − r̄_w at those points (NaN where not judged).
        z: (d − c)/σ at those points (NaN where not judged).
        judged: which points are past the window and outside restart graces.
        final_loss: L̂(T), the early-align divisor (NaN while the run is still before the window end).
        window: the alignment window used.
        status: ``"aligning"`` (not past the window end yet), ``"ok"`` or ``"alarm"``.
        first_alarm: t̂ at which the alarm was raised (the grid point where the GLR passed h), or None.
        exceed_since: the start τ of the ramp whose GLR passed h (the change point), or None.
        direction: ``"above"`` (loss higher than the shape says) when alarmed, else None.
        statistic: the GLR statistic at the newest judged grid point (0 before any).
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
    change: np.ndarray = field(default_factory=lambda: np.empty(0))
    statistic: float = 0.0

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


def residual_change(t: np.ndarray, r: np.ndarray, usable: np.ndarray, window_end: float,
                    rule: DetectorRule) -> np.ndarray:
    """d = r̄(t̂) − r̄_w at every point past ``window_end`` (NaN elsewhere, and where the trailing
    stretch holds no usable point): r̄ the mean of the ``usable`` r over the trailing
    ``rule.smoothing``, r̄_w over the last ``rule.level_span`` of the window."""
    level_pts = usable & (t <= window_end) & (t >= window_end - rule.level_span)
    if not level_pts.any():
        level_pts = usable & (t <= window_end)
    level = float(r[level_pts].mean())
    csum = np.concatenate([[0.0], np.cumsum(np.where(usable, r, 0.0))])
    ccount = np.concatenate([[0], np.cumsum(usable)])
    start = np.searchsorted(t, t - rule.smoothing, side="right")
    stop = np.arange(1, t.size + 1)
    count = ccount[stop] - ccount[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (csum[stop] - csum[start]) / count
    return np.where((t > window_end) & usable & (count > 0), mean - level, np.nan)


def ramp_glr(grid: np.ndarray, z: np.ndarray, band: NoiseBand, window_end: float
             ) -> tuple[Optional[float], Optional[float], float]:
    """The sequential GLR for a ramp in d (the residual growing linearly from an unknown start):
    at each grid point with a finite z, max over the starts τ (the window end, each earlier
    judged point) of zᵀR⁻¹f_τ/√(f_τᵀR⁻¹f_τ) over the points so far; alarm when it passes h.
    Returns (alarm t̂, the start τ of the ramp that passed, statistic at the last point), or
    (None, None, statistic)."""
    keep = np.isfinite(z)
    g, zz = grid[keep], z[keep]
    if g.size == 0:
        return None, None, 0.0
    _, scale = band.at(g)
    correlation = band.correlation_at(g)
    stat = 0.0
    for m in range(1, g.size + 1):
        weights = ramp_weights(g[:m], scale[:m], correlation[:m, :m], window_end)
        values = zz[:m] @ weights
        j = int(np.argmax(values))
        stat = float(values[j])
        if stat > band.rule.threshold:
            return float(g[m - 1]), float(window_end if j == 0 else g[j - 1]), stat
    return None, None, stat


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
    """The residual r(t̂) of a (partial) run, its change after the window and the detector's verdict.

    ``reference``: a Predictor (then ``controls`` are the run's τ, TPP and schedule) or a
    reference normalised curve (a ``Curve`` or a ``(t̂, ℓ)`` pair; see
    ``predictors.align.reference_at``). The warmup comes from ``controls`` when given.
    ``restarts``: t̂ of marked restarts and micro-batch changes. Raises ``ValueError`` on bad
    input (non-finite or non-positive losses, t̂ not increasing in [0, 1], a reference that
    covers fewer than 2 points of the window once the run has passed it).

    Example:
        A run on its reference shape is ok; the same run drifting up to +5% from t̂ = 0.5 alarms
        once the ramp GLR on its change (the flat uncalibrated σ = 1%) passes h:

        >>> t = np.linspace(0.01, 1.0, 200)
        >>> ell = 1.0 + 0.5 * (1.0 - t) ** 2
        >>> monitor_curve(t, 2.0 * ell, (t, ell)).status
        'ok'
        >>> r = monitor_curve(t, 2.0 * ell * (1 + 0.05 * np.clip((t - 0.5) / 0.5, 0, 1)), (t, ell))
        >>> r.status, round(r.first_alarm, 3), r.exceed_since
        ('alarm', 0.875, 0.525)
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
        return MonitorResult(t, nan, nan, np.zeros(t.size, dtype=bool), math.nan, (lo, hi), "aligning", change=nan)
    in_window = (t >= lo) & (t <= hi) & ~grace
    # A predictor with an irreducible loss L̂ predicts L = L̂ + L̂(T)·ℓ̂: its ℓ̂ is the shape of the
    # reducible part, so that part is aligned, and r is the loss over that prediction − 1 (on the
    # public ladder, L̂ 2.75 of L ~3.1: aligning L itself on ℓ̂ left a 10% residual on clean runs).
    floor = float(getattr(getattr(reference, "params", None), "irreducible_loss", 0.0) or 0.0)
    if floor and float(y[in_window | (t > hi)].min()) <= floor:
        raise ValueError(f"monitor: loss {float(y.min()):.4g} is at or below the predictor's irreducible loss {floor:.4g}")
    divisor = window_divisor(y - floor, ell, in_window, (lo, hi), objective, "monitor",
                             "covered by the reference, outside restart graces")
    r = y / (floor + divisor * ell) - 1.0
    judged = (t > hi) & ~grace
    d = residual_change(t, r, ~grace, hi, rule)
    center, scale = band.at(t)
    z = np.where(judged, (d - center) / scale, np.nan)
    grid, z_grid = _on_grid(t, d, judged, hi, band)
    first, since, s = ramp_glr(grid, z_grid, band, hi)
    return MonitorResult(t, r, z, judged, floor + divisor, (lo, hi), "alarm" if first is not None else "ok",
                         first, since, "above" if first is not None else None, d, s)


def _on_grid(t: np.ndarray, d: np.ndarray, judged: np.ndarray, window_end: float, band: NoiseBand
             ) -> tuple[np.ndarray, np.ndarray]:
    """z at the grid points past the window the run has reached: d at the newest judged point
    at or before each (NaN where that point is in a restart grace or older than the grid step)."""
    grid = np.asarray([g for g in BAND_GRID if window_end < g <= t[-1] + 1e-9])
    if grid.size == 0:
        return grid, grid
    idx = np.searchsorted(t, grid + 1e-9, side="right") - 1
    step = BAND_GRID[1] - BAND_GRID[0]
    ok = (idx >= 0) & judged[np.maximum(idx, 0)] & (grid - t[np.maximum(idx, 0)] < step)
    value = np.where(ok, d[np.maximum(idx, 0)], np.nan)
    center, scale = band.at(grid)
    return grid, (value - center) / scale


def band_changes(
    curves: Sequence[Any], reference: Any, *, rule: DetectorRule = DetectorRule(),
    window: Sequence[float] = MONITOR_WINDOW, grid: Sequence[float] = BAND_GRID, objective: str = "log",
) -> np.ndarray:
    """d(t̂) of each complete clean curve (``predictors.Curve``) on ``grid``: shape (runs, grid),
    NaN at grid points inside the run's window.

    ``reference`` is a Predictor (each curve's controls, with N from its meta) or a callable
    ``curve -> reference`` (for reference curves of matching controls). Curves the reference
    does not cover on the whole grid are skipped.
    """
    from predictors.curves import controls_with_size

    g = np.asarray(grid, dtype=float)
    flat = NoiseBand(tuple(g), tuple(np.zeros(g.size)), tuple(np.ones(g.size)), 0, tuple(window), rule)  # type: ignore[arg-type]
    rows = []
    for curve in curves:
        controls = controls_with_size(curve)
        ref = reference(curve) if callable(reference) and not hasattr(reference, "normalized_curve") else reference
        if ref is None:
            continue
        result = monitor_curve(curve.t_hat, curve.loss, ref, controls, band=flat, objective=objective)
        if result.status == "aligning" or result.t_hat[0] > g[0] or result.t_hat[-1] < g[-1] - 0.01:
            continue
        rows.append(_grid_values(g, result))
    return np.asarray(rows, dtype=float).reshape(len(rows), g.size)


def _grid_values(grid: np.ndarray, result: MonitorResult) -> np.ndarray:
    """d at the grid points past the run's window (NaN before), as the detector reads it."""
    idx = np.searchsorted(result.t_hat, grid + 1e-9, side="right") - 1
    ok = (grid > result.window[1]) & (idx >= 0)
    return np.where(ok, result.change[np.maximum(idx, 0)], np.nan)


def _band_of(changes: np.ndarray, grid: Sequence[float], rule: DetectorRule, window: Sequence[float],
             n_curves: int, source: str, centered: bool) -> NoiseBand:
    """Mean (0 where ``centered`` is False) and RMS about it of ``changes`` per grid point; the
    rule's h set for its false-alarm rate from the correlation of z across the judged points."""
    g = np.asarray(grid, dtype=float)
    finite = np.isfinite(changes)
    judged = finite.sum(axis=0) >= 3  # grid points inside most runs' windows are never judged
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        center = np.where(judged, np.nanmean(changes, axis=0) if centered else 0.0, 0.0)
        scale = np.where(judged, np.sqrt(np.nanmean((changes - center) ** 2, axis=0)), 0.0)
    scale_used = np.maximum(scale, rule.min_scale)
    correlation = np.eye(g.size)
    correlation[np.ix_(judged, judged)] = _correlation((changes[:, judged] - center[judged]) / scale_used[judged])
    h = glr_threshold(rule.false_alarm_rate, g[judged], scale_used[judged], correlation[np.ix_(judged, judged)],
                      float(window[1]), rule.shrinkage)
    # Grid points inside the window are never judged: hold the first judged value there.
    first = int(np.argmax(judged))
    center[:first], scale[:first] = center[first], scale[first]
    return NoiseBand(tuple(float(x) for x in g), tuple(float(x) for x in np.round(center, 6)),
                     tuple(float(x) for x in np.round(scale, 6)), int(n_curves),
                     (float(window[0]), float(window[1])), replace(rule, h=h), source,
                     correlation=tuple(tuple(float(x) for x in row) for row in np.round(correlation, 4)))


def _correlation(z: np.ndarray) -> np.ndarray:
    """corr between the columns of ``z`` over the rows finite in both (pairwise), made positive
    semi-definite (negative eigenvalues clipped) with a unit diagonal."""
    finite = np.isfinite(z)
    zf = np.where(finite, z, 0.0)
    counts = finite.T.astype(float) @ finite.astype(float)
    cov = (zf.T @ zf) / np.maximum(counts, 1.0)
    w, v = np.linalg.eigh((cov + cov.T) / 2.0)
    cov = (v * np.clip(w, 0.0, None)) @ v.T
    d = np.sqrt(np.maximum(np.diag(cov), 1e-12))
    return np.clip(cov / np.outer(d, d), -1.0, 1.0)


def calibrate_band(
    curves: Sequence[Any], reference: Any, *, rule: DetectorRule = DetectorRule(),
    window: Sequence[float] = MONITOR_WINDOW, grid: Sequence[float] = BAND_GRID, source: str = "",
    objective: str = "log", reference_band: Optional[NoiseBand] = None,
) -> NoiseBand:
    """The noise band of d(t̂) over clean complete runs: mean and RMS about it on ``grid``, the
    rule's h set for its stated false-alarm rate from the measured correlation of z.

    ``reference_band`` (from :func:`calibrate_reference_band`) is carried along. Raises
    ``ValueError`` when fewer than 3 curves are covered (a spread needs several runs).
    """
    changes = band_changes(curves, reference, rule=rule, window=window, grid=grid, objective=objective)
    if changes.shape[0] < 3:
        raise ValueError(f"monitor band: needs at least 3 clean complete curves, got {changes.shape[0]}")
    band = _band_of(changes, grid, rule, window, changes.shape[0], source, centered=True)
    return replace(band, reference=reference_band)


def same_controls(a: Any, b: Any) -> bool:
    """Whether two curves share their controls: schedule (:meth:`Schedule.same_as`: name,
    warmup, floor, WSD decay and shape, logged points) and τ, TPP and N within 1%
    (``predictors.references.SAME_TOLERANCE``)."""
    from predictors.curves import controls_with_size
    from predictors.references import SAME_TOLERANCE

    x, y = controls_with_size(a), controls_with_size(b)
    if not x.schedule.same_as(y.schedule):
        return False

    def near(p: Optional[float], q: Optional[float]) -> bool:
        if p is None or q is None:
            return p is None and q is None
        if math.isinf(p) or math.isinf(q):
            return math.isinf(p) and math.isinf(q)
        return abs(p / q - 1.0) <= SAME_TOLERANCE

    return near(x.tau, y.tau) and near(x.tokens_per_param, y.tokens_per_param) and near(x.n_params, y.n_params)


def pair_changes(
    curves: Sequence[Any], *, rule: DetectorRule = DetectorRule(), window: Sequence[float] = MONITOR_WINDOW,
    grid: Sequence[float] = BAND_GRID, objective: str = "log", max_partners: int = 3, same_seed: bool = False,
) -> np.ndarray:
    """d(t̂) on ``grid`` of each complete curve against each of up to ``max_partners`` other
    curves with the same controls (:func:`same_controls`), the same corpus (``meta["corpus_hash"]``
    where both carry one) and not the same seed (``meta["seed"]``; runs of one seed share their
    data order, so they would understate the spread): the variation a reference run of another
    seed brings. ``same_seed``: re-runs of identical settings, seed included, pair too (their
    spread is the nondeterminism alone: a reference that repeats the run). Shape (ordered pairs, grid)."""
    done = [c for c in curves if float(c.t_hat[-1]) >= 0.99]

    def differs(a: Any, b: Any, key: str) -> bool:
        x, y = a.meta.get(key), b.meta.get(key)
        return x not in (None, "") and y not in (None, "") and str(x) != str(y)

    rows = []
    for i, curve in enumerate(done):
        partners = [c for j, c in enumerate(done) if j != i and same_controls(curve, c)
                    and not differs(curve, c, "corpus_hash")
                    and (same_seed or curve.meta.get("seed") is None or c.meta.get("seed") is None
                         or differs(curve, c, "seed"))]
        for partner in partners[:max_partners]:
            ref = (np.asarray(partner.t_hat, dtype=float), np.asarray(partner.loss, dtype=float) / float(partner.loss[-1]))
            rows.append(band_changes([curve], lambda _c, r=ref: r, rule=rule, window=window, grid=grid,
                                     objective=objective))
    g = np.asarray(grid)
    return np.concatenate(rows, axis=0) if rows else np.empty((0, g.size))


def pair_contrasts(curves: Sequence[Any], *, same_seed: bool = False) -> int:
    """Independent pairs among the complete ``curves`` (those :func:`pair_changes` pairs): Σ(k − 1)
    over the groups of one set of controls and corpus, k its distinct seeds (a curve without a
    seed counts as its own; with ``same_seed`` every curve does): the degrees of freedom, in
    paths, of a spread measured on them."""
    done = [c for c in curves if float(c.t_hat[-1]) >= 0.99]
    groups: list[list[Any]] = []
    for curve in done:
        for group in groups:
            head = group[0]
            corpus = (curve.meta.get("corpus_hash"), head.meta.get("corpus_hash"))
            if same_controls(curve, head) and (None in corpus or "" in corpus or str(corpus[0]) == str(corpus[1])):
                group.append(curve)
                break
        else:
            groups.append([curve])
    total = 0
    for group in groups:
        seeds = [c.meta.get("seed") for c in group]
        k = len(group) if same_seed else (len({str(x) for x in seeds if x not in (None, "")})
                                          + sum(x in (None, "") for x in seeds))
        total += max(k - 1, 0)
    return total


def calibrate_reference_band(
    curves: Sequence[Any], *, rule: DetectorRule = DetectorRule(), window: Sequence[float] = MONITOR_WINDOW,
    grid: Sequence[float] = BAND_GRID, objective: str = "log", source: str = "",
) -> Optional[NoiseBand]:
    """The reference-mode band: RMS of d over the pairs of :func:`pair_changes` (centre 0), the
    rule's h for its correlation. None when fewer than 3 pairs exist."""
    changes = pair_changes(curves, rule=rule, window=window, grid=grid, objective=objective)
    if changes.shape[0] < 3:
        return None
    return _band_of(changes, grid, rule, window, changes.shape[0], source, centered=False)


def scaled_band(shape: NoiseBand, changes: np.ndarray, *, grid: Sequence[float] = BAND_GRID,
                source: str = "", contrasts: Optional[int] = None) -> NoiseBand:
    """``shape`` rescaled to the spread of the pair ``changes`` (on ``grid``) that a user's
    reference runs give (:func:`pair_changes` on them): centre 0, σ(t̂) = ρ·σ_shape(t̂) with one
    factor ρ, not a σ per t̂ (two reference runs give one pair, too few for a spread at every
    point). The rule and correlation are the shape's (where measured on ``grid``).

    ρ² is the scale of z = d/σ_shape measured the way the detector reads z, whitened with the
    correlation it whitens with (R_λ, the shape's R shrunk): ρ² = Σ zᵀR_λ⁻¹z / Σ tr(R_λ⁻¹R) over
    the pairs. The plain mean of z² would do as an average, but d is one path strongly correlated
    along t̂, so it has ~2.5 degrees of freedom a pair (a pair that happens to sit close gives a
    narrow band, and every run judged with it alarms: at 0.1M, 7 of 75 clean runs against a
    stated 0.5%); whitened, ~11. What doubt is left raises h: the spread has ν = ``contrasts`` ×
    tr(A)²/tr(A²) degrees of freedom (A = R_λ⁻¹R; ``contrasts``: independent pairs, Σ(k − 1)
    over groups of k reference runs of one set of controls, :func:`pair_contrasts`; default the
    ordered pairs / 2) and h is :func:`glr_threshold` with that ``spread_dof``, never below the
    shape's own."""
    g = np.asarray(grid, dtype=float)
    if changes.ndim != 2 or changes.shape[1] != g.size or changes.shape[0] == 0:
        raise ValueError("monitor: scaled_band needs pair changes on the grid, one row per pair")
    _, sigma = shape.at(g)
    finite = np.isfinite(changes)
    points = finite.any(axis=0)
    if not points.any():
        raise ValueError("monitor: scaled_band needs pair changes past the alignment window")
    same_grid = len(shape.t_hat) == g.size and bool(np.allclose(shape.t_hat, g))
    measured = (np.asarray(shape.correlation, dtype=float) if same_grid and shape.correlation is not None
                else ar1_correlation(g))
    whitening = shrunk(measured, shape.rule.shrinkage)
    energy = trace = 0.0
    for row, ok in zip(changes / sigma, finite):
        if ok.any():
            energy += float(row[ok] @ np.linalg.solve(whitening[np.ix_(ok, ok)], row[ok]))
            trace += float(np.trace(np.linalg.solve(whitening[np.ix_(ok, ok)], measured[np.ix_(ok, ok)])))
    rho = math.sqrt(energy / trace)
    a = np.linalg.solve(whitening[np.ix_(points, points)], measured[np.ix_(points, points)])
    per_path = float(np.trace(a) ** 2 / np.trace(a @ a))
    dof = max(1, int(contrasts) if contrasts is not None else changes.shape[0] // 2) * per_path
    # Never below the shape's own h: a spread measured on the user's runs only ever adds doubt.
    h = max(shape.rule.threshold, glr_threshold(shape.rule.false_alarm_rate, g[points], sigma[points],
                                                measured[np.ix_(points, points)], float(shape.window[1]),
                                                shape.rule.shrinkage, spread_dof=dof))
    return NoiseBand(tuple(float(x) for x in g), tuple(0.0 for _ in g), tuple(float(x) for x in np.round(rho * sigma, 6)),
                     int(changes.shape[0]), shape.window, replace(shape.rule, h=h),
                     f"{source}; h {h:.3g} for a spread with {dof:.0f} degrees of freedom",
                     correlation=shape.correlation if same_grid else None)
