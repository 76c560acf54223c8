"""A training-loss curve with its TLC controls: the unit the fit and the calibration work on."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

from predictors.controls import Controls
from predictors.io import finite_or_none
from predictors.normalize import check_curve, normalize_loss, smooth_loss, training_fraction_of


#: Tolerance when comparing a t̂ with a decision fraction (t̂ = tokens/D is not exact in floats).
T_HAT_EPS = 1e-9


def rung_cut(t_hat: Any, stop_fraction: float) -> int | None:
    """How many points of a curve a trial judged at decision fraction s has reported: the
    points up to and including the first with t̂ ≥ s (within :data:`T_HAT_EPS`), because a
    live trial only knows it has reached a rung when it reports a point at or past it.
    None when the curve never reaches s. ``t_hat`` must be non-decreasing.

    This is the project's one cut at a stop fraction: the scheduler's rungs, the replay, the
    report, the calibrated decision and ranking errors and every benchmark use it.

    Example:
        >>> rung_cut([0.05, 0.1, 0.15, 0.2], 0.1), rung_cut([0.05, 0.12, 0.2], 0.1), rung_cut([0.05], 0.1)
        (2, 2, None)
    """
    t = np.asarray(t_hat, dtype=np.float64)
    i = int(np.searchsorted(t, float(stop_fraction) - T_HAT_EPS, side="left"))
    return None if i >= t.size else i + 1


#: A curve whose last point is at t̂ ≥ this has reached the end of training, whatever its logging interval.
COMPLETE_T_HAT = 0.99


def reaches_end(t_hat: Any) -> bool:
    """Whether a run's points reach the end of training: the last point is at t̂ ≥
    :data:`COMPLETE_T_HAT`, or within one logging interval of t̂ = 1. A run evaluated every 200 of
    25,000 steps logs its last point at step 24,800 (t̂ 0.992); one evaluated every 200 of 3,000
    steps ends at t̂ 0.933 and is complete too. The interval is the median spacing of the last ten
    points, so one odd extra point does not stretch it. This is the project's one test of a
    complete run: the curve import and the fit both use it.

    Example:
        >>> reaches_end([0.2, 0.4, 0.6, 0.8, 0.96]), reaches_end([0.2, 0.4, 0.6, 0.75])
        (True, False)
    """
    t = np.asarray(t_hat, dtype=np.float64)
    if t.size == 0:
        return False
    if t[-1] >= COMPLETE_T_HAT:
        return True
    spacing = np.diff(t[-11:])
    return bool(spacing.size > 0 and 1.0 - t[-1] <= float(np.median(spacing)) * (1 + 1e-9))


@dataclass(frozen=True, eq=False)
class Curve:
    """One (smoothed) training-loss curve over the training fraction.

    Args:
        t_hat: training fractions, strictly increasing inside [0, 1].
        loss: the (already smoothed) loss at those points, finite and > 0.
        controls: τ, TPP and schedule of the run.
        meta: free-form provenance (``n_params``, ``corpus_hash``, ``seed``, ``name`` ...).

    Construction raises ``ValueError`` on bad input (non-finite losses are an error here, never
    skipped; see :func:`predictors.normalize.drop_nonfinite`).
    """

    t_hat: np.ndarray
    loss: np.ndarray
    controls: Controls
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.controls, Controls):
            raise ValueError(f"curve: controls must be a Controls, got {type(self.controls).__name__}")
        name = f"curve {self.meta.get('name', '')}".strip()
        t, y = check_curve(self.t_hat, self.loss, min_points=2, name=name)
        t.setflags(write=False)
        y.setflags(write=False)
        object.__setattr__(self, "t_hat", t)
        object.__setattr__(self, "loss", y)
        object.__setattr__(self, "meta", dict(self.meta))

    @property
    def final_loss(self) -> float:
        """The loss at the last point: L(1), the final loss
        (``predictors.smoothing.FINAL_LOSS_DEFINITION``), when the curve ends at t̂ = 1."""
        return float(self.loss[-1])

    @property
    def normalized(self) -> np.ndarray:
        """ℓ(t̂) = L(t̂)/L(last point) (paper Eq. 1 with L̂ = 0)."""
        return normalize_loss(self.loss)

    def head(self, stop_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """What a trial judged at ``stop_fraction`` has reported (:func:`rung_cut`); the whole
        curve when it ends before that fraction."""
        n = rung_cut(self.t_hat, stop_fraction)
        n = self.t_hat.size if n is None else n
        return self.t_hat[:n], self.loss[:n]

    @classmethod
    def from_tokens(
        cls,
        tokens: Any,
        loss: Any,
        total_tokens: float,
        controls: Controls,
        *,
        window_tokens: float | None = None,
        window_sequences: float | None = None,
        seq_len: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> "Curve":
        """Build from raw per-step losses: smooth over a token window, then t̂ = tokens/total.

        Give the window either in tokens or in sequences (× ``seq_len``); a window of 0 means
        the losses are already smoothed.
        """
        if window_tokens is None and window_sequences is None:
            window_tokens = 0.0
        smoothed = smooth_loss(
            tokens, loss, window_tokens=window_tokens, window_sequences=window_sequences, seq_len=seq_len
        )
        t_hat = training_fraction_of(tokens, total_tokens)
        return cls(t_hat, smoothed, controls, dict(meta or {}))


def curve_size(curve: "Curve") -> Optional[float]:
    """A curve's non-embedding size N: ``meta["n_params"]``, else ``controls.n_params``; None
    when neither is a finite number > 0."""
    for value in (curve.meta.get("n_params"), curve.controls.n_params):
        try:
            n = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(n) and n > 0:
            return n
    return None


def controls_with_size(curve: Curve) -> Controls:
    """The curve's controls with N filled in from ``meta["n_params"]`` when the controls lack
    it (banked and imported curves carry N in their meta), so a size-aware predictor sees it."""
    c = curve.controls
    if c.n_params is not None:
        return c
    n = curve_size(curve)
    return c if n is None else dataclasses.replace(c, n_params=n)


# ---------------------------------------------------------------------- compute accounting


def compute_fraction(
    reached: Mapping[str, float], weights: Optional[Mapping[str, Optional[float]]] = None,
    extra: Optional[Mapping[str, float]] = None,
) -> float:
    """The compute a sweep spent, as a fraction of training every trial to the end:
    Σ_i w_i·(t̂_i + r_i) / Σ_i w_i, with t̂_i the fraction trial i reached (clipped to
    [0, 1]), r_i the fraction it trained twice (``extra``: work redone after a restart
    without a checkpoint) and w_i = N_i·D_i (``weights``; equal weights unless every trial
    has a positive one: exact within a sweep of one model size and TPP).

    Example:
        >>> round(compute_fraction({"a": 1.0, "b": 0.1, "c": 0.1}), 6)
        0.4
    """
    if not reached:
        return 0.0
    ids = list(reached)
    w = [finite_or_none((weights or {}).get(i)) for i in ids]
    if any(v is None or v <= 0 for v in w):
        w = [1.0] * len(ids)
    done = sum(wi * (min(max(float(reached[i]), 0.0), 1.0) + max(float((extra or {}).get(i, 0.0)), 0.0))
               for i, wi in zip(ids, w))
    return float(done / sum(w))  # type: ignore[arg-type]


def is_finished(train_fraction: float) -> bool:
    """Whether a trial that reached ``train_fraction`` ran to the end."""
    from predictors.smoothing import FINISHED_T_HAT

    return float(train_fraction) >= FINISHED_T_HAT
