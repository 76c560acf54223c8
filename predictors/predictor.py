"""The fitted predictor: ℓ̂ for any run's controls, final-loss prediction from a partial
curve (paper §5 step 5), and JSON persistence (never pickle; the file's schema:
``predictors.predictor_file``; the calibrated error: ``predictors.decision_error``).

The scheduler uses :meth:`Predictor.predict_final`, :attr:`Predictor.decision_error` and
:meth:`Predictor.relative_error`; the report also :meth:`Predictor.normalized_curve` and
:meth:`Predictor.loss_curve`; the sweep loads the file with :meth:`Predictor.load`.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np

from predictors import equations
from predictors.align import (
    AlignSettings,
    align_divisor,
    check_segment,
    rms_relative_residual,
    segment_indices,
)
from predictors.controls import Controls
from predictors.decision_error import DECISION_FRACTIONS, DecisionError
from predictors.distance import direction_of, off_scale_error
from predictors.io import atomic_write_json, loads_strict
from predictors.normalize import T_HAT_SLACK, check_curve, check_t_hat
from predictors.prediction import Prediction
from predictors.ranking import Order, Position, RankingError
from predictors.monitor import UNCALIBRATED_BAND, NoiseBand
from predictors.predictor_file import SCHEMA, SCHEMA_VERSION, from_document, to_document
from predictors.references import ReferenceCurves
from predictors.run_keys import DEFAULT_METRIC
from predictors.surrogate import SurrogateParams

# The distribution whose version the provenance records, and the version recorded when it is
# not installed (predictors must stay importable on its own).
DISTRIBUTION = "collapse-hpo"
FALLBACK_VERSION = "0.1.0"
# Sub-samples per point when ℓ̂ is averaged over a trailing smoothing window.
SMOOTHING_SUBSAMPLES = 16
# predict_finals pads runs into one array from this many on; fewer are predicted one by one,
# which is cheaper below it (a batch's fixed cost is ~0.5 ms, one memoised run's ~0.05–0.2 ms).
BATCH_FROM = 8
NO_CALIBRATED_ERROR = "calibrated error not computed (calibrated_error=False)"
# Entries per memo of predict_final's pieces (``Predictor._memo_table``): a 10,000-trial sweep's
# controls fit (at 4,096 each rung's predictions found their memos cleared by the one before).
MEMO_SIZE = 1 << 15
# A run is at the calibrated scale when its TPP (and N, when known) lies within this relative
# distance of a TPP (N) the predictor was calibrated on.
SCALE_TOLERANCE = 0.1
#: A sweep this many times beyond the calibrated model sizes ranks by its losses, not its predicted
#: finals (``Predictor.off_scale_note``): the sizes a size extrapolation's error was measured at
#: (held-out sizes of a ladder) span a few times, not tens.
OFF_SCALE_SIZE_RATIO = 30.0
# The axes on which the decision error judges how far a run is off the calibrated scale, with
# the provenance key that lists the calibrated values (the ranking error uses the first two).
DECISION_AXES = (("tokens_per_param", "tokens_per_param"), ("n_params", "model_sizes"), ("tau", "taus"))


class NParamsMissingWarning(UserWarning):
    """A run without ``n_params`` was predicted by a predictor calibrated on model sizes: it is
    assumed to be at a calibrated size, so the in-scale error is stated (issue 15: ±2σ then
    covered 20% instead of 75% on a ladder extrapolated 2–3× in N)."""


def package_version() -> str:
    """The installed ``collapse-hpo`` distribution's version (from its metadata, so the
    lowest layer never imports ``hpo``), or a literal fallback in an uninstalled checkout."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - depends on the environment
        return FALLBACK_VERSION


@dataclass(frozen=True, eq=False)
class Predictor:
    """A fitted collapse surrogate plus how to align partial curves to it.

    Example:
        A run that follows ℓ̂ exactly with final loss 1.7, seen up to t̂ = 0.3: the predicted
        final loss is 1.7, and an uncalibrated predictor states only the alignment residual.

        >>> from predictors import Controls, Predictor, SurrogateParams
        >>> from predictors.schedules import Schedule
        >>> predictor = Predictor(SurrogateParams(b_const=0.2, b_exp=-0.5, q_const=0.3, q_exp=-0.1))
        >>> controls = Controls(tau=0.3, tokens_per_param=20, schedule=Schedule("linear"))
        >>> t_hat = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
        >>> loss = 1.7 * predictor.normalized_curve(t_hat, controls)
        >>> p = predictor.predict_final(t_hat, loss, controls)
        >>> round(p.final_loss, 6), round(p.uncertainty, 6), p.n_points
        (1.7, 0.0, 3)
        >>> round(float(predictor.loss_curve([1.0], controls, p.final_loss)[0]), 6)
        1.7

        ``Predictor.load(path)`` reads a calibrated predictor (``hpo/data/predictors/default.json``
        is the shipped one) and ``save(path)`` writes one.

    Args:
        params: b_const, b_exp, q_const, q_exp and the constants m, ε1, ε2 (Eq. 4–5).
        m_fitted: whether m was fitted ("five-parameter mode") or fixed.
        align: alignment settings for :meth:`predict_final`.
        decision_error: calibrated relative error of the predicted final loss by stop fraction
            (filled by :func:`predictors.fit`); ``None`` means uncalibrated.
        provenance: what the predictor was fitted on (JSON-serialisable values).
        ranking_error: how reliably it orders the trials of one sweep, by kind of sweep and
            stop fraction (``predictors.ranking``; measured by ``hpo calibrate``), or None.
        references: calibrated normalised curves by controls and size
            (``predictors.references``): when set, a run whose controls match one gets ℓ from
            them, interpolated in log N (paper §5 steps 2–3), and every other run the
            surrogate. ``hpo calibrate`` sets it when leave-one-size-out says it predicts better.
        monitor: the noise band of the collapse residual on clean runs and the detector rule
            (``predictors.monitor``; measured by ``hpo calibrate``), or None.
    """

    params: SurrogateParams
    m_fitted: bool = False
    align: AlignSettings = field(default_factory=AlignSettings)
    decision_error: Optional[DecisionError] = None
    provenance: dict[str, Any] = field(default_factory=dict)
    ranking_error: Optional[RankingError] = None
    references: Optional[ReferenceCurves] = None
    monitor: Optional[NoiseBand] = None
    #: The sweep's choice, never saved: rank by the predicted finals even ``OFF_SCALE_SIZE_RATIO``
    #: times or more beyond the calibrated sizes (``scheduler.trust_off_scale``).
    trust_off_scale: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.params, SurrogateParams):
            raise ValueError("params: must be a SurrogateParams")
        if not isinstance(self.align, AlignSettings):
            raise ValueError("align: must be an AlignSettings")
        if self.ranking_error is not None and not isinstance(self.ranking_error, RankingError):
            raise ValueError("ranking_error: must be a RankingError")
        if self.references is not None and not isinstance(self.references, ReferenceCurves):
            raise ValueError("references: must be a ReferenceCurves")
        if self.monitor is not None and not isinstance(self.monitor, NoiseBand):
            raise ValueError("monitor: must be a NoiseBand")
        object.__setattr__(self, "_warned", set())
        # Small per-controls cache of (b, q, η(1)): the scheduler calls predict_final many
        # times for the same few trials.
        object.__setattr__(self, "_cache", {})
        # Memos for predict_final, which a rung round calls once per arrival (issue 30: ~1.7 s of
        # a 10,000-trial round): η on a t̂ grid by schedule (the trials of a sweep share it and
        # their report grid), ℓ̂ on a grid by controls (an η or B sweep shares τ/TPP/schedule)
        # and the calibrated error by (stop fraction, controls). Each is a pure function of its
        # key and this (frozen) predictor, so a hit returns the number a miss would compute.
        object.__setattr__(self, "_memo", {"schedule": {}, "ell": {}, "error": {}, "position": {},
                                           "reference": {}, "source": {}, "axis_fit": {}, "situation": {}})

    # ------------------------------------------------------------------ curves
    def normalized_curve(self, t_hat: Any, controls: Controls) -> np.ndarray:
        """ℓ̂ at ``t_hat`` (each in [0, 1], any order) for a run with ``controls`` (Eq. 4–5)."""
        t = check_t_hat(np.atleast_1d(np.asarray(t_hat, dtype=np.float64)), increasing=False)
        return self._ell_hat(t, controls)

    def loss_curve(self, t_hat: Any, controls: Controls, final_loss: float) -> np.ndarray:
        """The loss L(t̂) = L̂ + (L(1) − L̂)·ℓ̂(t̂) of a run whose final loss is ``final_loss``
        (Eq. 1 solved for L; L(1)·ℓ̂ when the irreducible loss L̂ is 0)."""
        return equations.loss_from_normalized(
            self.normalized_curve(t_hat, controls), final_loss, self.params.irreducible_loss
        )

    # ------------------------------------------------------------------ scale
    def scale_check(self, controls: Controls) -> tuple[bool, str]:
        """Is a run with ``controls`` at the scale this predictor was calibrated on?

        Returns (at_reference, why). At the reference means its TPP is within
        ``SCALE_TOLERANCE`` of a calibrated TPP and, when ``controls.n_params`` is known, its N
        within the same of a calibrated model size (``provenance`` ``tokens_per_param`` and
        ``model_sizes``). A predictor without that provenance counts every run as at its scale;
        an unknown N is assumed to be the reference's (said in ``why``).
        """
        prov = self.provenance

        def near(value: float, known: Any) -> Optional[bool]:
            try:
                refs = [float(k) for k in known]
            except (TypeError, ValueError):
                return None
            refs = [r for r in refs if math.isfinite(r) and r > 0]
            if not refs:
                return None
            return any(abs(value / r - 1.0) <= SCALE_TOLERANCE for r in refs)

        tpp_ok = near(float(controls.tokens_per_param), prov.get("tokens_per_param") or [])
        if tpp_ok is False:
            return False, (f"TPP {controls.tokens_per_param:g} is not a calibrated TPP "
                           f"({', '.join(f'{float(v):g}' for v in prov['tokens_per_param'])})")
        if controls.n_params is None:
            return True, "N not reported: assumed the calibrated model size"
        n_ok = near(float(controls.n_params), prov.get("model_sizes") or [])
        if n_ok is False:
            sizes = ", ".join(f"{float(v):.3g}" for v in prov["model_sizes"])
            return False, f"N = {controls.n_params:.3g} is not a calibrated model size ({sizes})"
        return True, "at the calibrated scale"

    def size_ratio(self, n_params: Optional[float]) -> Optional[float]:
        """How many times beyond the calibrated model sizes (``provenance["model_sizes"]``) a run of
        ``n_params`` lies: 1 inside their range, N/largest above it, smallest/N below it; None when
        N or the calibrated sizes are unknown."""
        try:
            sizes = [float(v) for v in self.provenance.get("model_sizes") or []]
        except (TypeError, ValueError):
            return None
        sizes = [v for v in sizes if math.isfinite(v) and v > 0]
        if not sizes or n_params is None or not (math.isfinite(float(n_params)) and float(n_params) > 0):
            return None
        n = float(n_params)
        return max(1.0, n / max(sizes), min(sizes) / n)

    def off_scale_note(self, n_params: Optional[float]) -> Optional[str]:
        """One line when a run of ``n_params`` is :data:`OFF_SCALE_SIZE_RATIO` times or more beyond
        the calibrated sizes (what a sweep prints at its start), else None. Such a sweep ranks by
        the losses at the rung (:meth:`ranking_order`) unless ``trust_off_scale``: how far an
        extrapolation in size is off is not measured that far out (at 124M the 0.1M predictor's
        finals were 25–39% off while it stated ±12%)."""
        ratio = self.size_ratio(n_params)
        if ratio is None or ratio < OFF_SCALE_SIZE_RATIO:
            return None
        sizes = [float(v) for v in self.provenance["model_sizes"]]
        then = ("ranks by the predicted finals anyway (trust_off_scale)" if self.trust_off_scale else
                "ranks by the losses at the rung instead of the predicted finals "
                "(scheduler.trust_off_scale: true insists)")
        return (f"predictor fitted at N = {min(sizes):.3g}–{max(sizes):.3g}; this sweep's N = {float(n_params):.3g} is "
                f"{ratio:.0f}× beyond (≥ {OFF_SCALE_SIZE_RATIO:g}×): its error there is unmeasured, so the "
                f"sweep {then}")

    def positions(self, controls: Sequence[Controls], axes: Sequence[str] = ("tokens_per_param", "n_params")
                  ) -> list[Position]:
        """Where these runs lie off the calibrated scale: per axis (TPP, N where reported, and τ
        when ``axes`` holds ``"tau"``) and side of the calibrated range, the farthest run's
        ``Position``; [] when all are at calibrated values. The ranking error judges TPP and N
        (the default ``axes``; τ varies within its sweeps by kind); the decision error all
        three (:data:`DECISION_AXES`). τ = ∞ (no weight decay) is at the calibrated scale when
        the bank held such runs, else beyond every calibrated τ (distance ∞)."""
        prov = self.provenance
        keys = dict(DECISION_AXES)
        worst: dict[tuple[str, bool], Position] = {}
        for c in controls:
            for axis in axes:
                value = {"tokens_per_param": c.tokens_per_param, "n_params": c.n_params, "tau": c.tau}[axis]
                known = prov.get(keys[axis])
                if value is None or not known:
                    continue
                if axis == "tau" and math.isinf(value):
                    pos = None if prov.get("no_weight_decay_curves") else Position("tau", False, math.inf)
                else:
                    pos = self._position_of(float(value), known, axis)
                if pos is None:
                    continue
                key = (pos.axis, pos.inside)
                if key not in worst or pos.distance > worst[key].distance:
                    worst[key] = pos
        return list(worst.values())

    def _position_of(self, value: float, known: Any, axis: str) -> Optional[Position]:
        """``Position.of`` memoised by (axis, value): a sweep's trials share TPP and N, rungs repeat τ."""
        memo, key = self._memo_table("position"), (axis, value)
        if key not in memo:
            memo[key] = Position.of(value, known, axis)
        return memo[key]

    def _directions(self, controls: Controls) -> dict[str, str]:
        """Per axis where ``controls`` lie beyond the calibrated values: "above" or "below"."""
        out = {}
        for axis, key in DECISION_AXES:
            value = {"tokens_per_param": controls.tokens_per_param, "n_params": controls.n_params,
                     "tau": controls.tau}[axis]
            known = self.provenance.get(key) or []
            if value is not None:
                try:
                    direction = direction_of(float(value), [float(k) for k in known])
                except (TypeError, ValueError):
                    direction = None
                if direction is not None:
                    out[axis] = direction
        return out

    def _warn_once(self, key: str, message: str, category: type[Warning] = UserWarning) -> None:
        warned: set[str] = self._warned  # type: ignore[attr-defined]
        if key not in warned:
            warned.add(key)
            warnings.warn(message, category, stacklevel=3)

    def _check_size_reported(self, controls: Controls) -> Optional[str]:
        """Warn (once per predictor) when a run has no N but the predictor knows sizes; the note."""
        if controls.n_params is not None or not self.provenance.get("model_sizes"):
            return None
        note = "N not reported: assumed a calibrated model size"
        self._warn_once("n_params", (
            "predictor: a run reports no n_params (Controls(..., n_params=N), its non-embedding parameter "
            "count); it is assumed to be at a calibrated model size, so the in-scale error is stated"
            + (" and the size-dependent curve is taken at the calibrated centre" if self.size_method != "surrogate"
               else "") + ". Give N to get the error for its distance from the calibrated sizes."),
            NParamsMissingWarning)
        return note

    def relative_error(self, stop_fraction: float, controls: Controls) -> tuple[float, str]:
        """The calibrated relative error e(s) that applies to a run with ``controls``, and its
        source; 0 when uncalibrated.

        At the calibrated scale: the in-scale (leave-one-out) error. Off it (TPP, N or τ not
        at a calibrated value, ``positions``), per axis: the RMS error that the held-out groups
        in the same situation (inside; or beyond on the same side) show at its distance
        (``predictors.distance``), the axes adding in variance except TPP and N, one distance
        counted once; on an axis without held-out
        groups (files before version 4), the pooled cross-scale error when it is the larger.
        A run without N is assumed at a calibrated size and warned about
        (:class:`NParamsMissingWarning`).
        """
        table = self.decision_error
        if table is None:
            return 0.0, "uncalibrated"
        s = float(stop_fraction)
        note = self._check_size_reported(controls)  # before the memo: it warns once per predictor
        memo, key = self._memo_table("error"), (s, controls)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._relative_error(s, controls, note)
        return hit

    def _relative_error(self, s: float, controls: Controls, note: Optional[str]) -> tuple[float, str]:
        """:meth:`relative_error` for a calibrated predictor, uncached."""
        table = self.decision_error
        assert table is not None
        in_scale = table.at(s)
        # Where the run lies does not depend on s: found once per controls, not once per rung.
        memo = self._memo_table("situation")
        situation = memo.get(controls)
        if situation is None:
            situation = memo[controls] = (self.positions([controls], axes=[a for a, _ in DECISION_AXES]),
                                          self._directions(controls), self.scale_check(controls))
        positions, directions, (at_reference, why) = situation
        if not positions:
            return in_scale, table.source + (f" ({note})" if note else "")
        value, words, unmeasured = (off_scale_error(table.groups, table.stop_fractions, s, in_scale, positions,
                                                    directions, fits=self._memo_table("axis_fit"))
                                    if table.groups else (None, [], positions))
        cross = table.cross_scale_at(s)
        if at_reference or all(p.axis == "tau" for p in unmeasured):
            why = ", ".join(p.words() for p in unmeasured)
        if unmeasured and cross is not None and cross > in_scale:
            base = in_scale if value is None else value
            value = math.sqrt(base * base + cross * cross - in_scale * in_scale)
            words.append(f"{table.cross_scale_source or 'cross-scale'} ({why})")
        elif unmeasured and value is None:
            if cross is None:
                return in_scale, f"{table.source}; {why}, but no cross-scale error was measured"
            return in_scale, f"{table.source} (larger than the cross-scale error; {why})"
        if note:
            words.append(note)
        assert value is not None
        return max(value, in_scale), "; ".join(words)

    def ranking_order(self, stop_fraction: float, kind: str, controls: Sequence[Controls] = ()) -> Order:
        """The order a rung ranks a sweep of ``kind`` by at ``stop_fraction``, and its ranking
        scale σ (log units), with their source in words (``predictors.ranking.Order``).

        ``kind`` is a sweep kind or kind group (``predictors.ranking``); ``controls`` are the
        sweep's trials. With a measured ranking error: ``RankingError.order_at`` (the blend of
        predicted finals and losses at the rung chosen by ``hpo calibrate``; off the calibrated
        scale the order error of held-out sweeps at least as far, else the losses' order).
        Without one: the predicted finals at √2·e(s), the error of the difference of two
        independent predictions each off by the decision error e(s) (conservative: a bias the
        trials share cancels in their order); an uncalibrated predictor states no scale.
        """
        off = [why for ok, why in (self.scale_check(c) for c in controls) if not ok]
        where = f"; {off[0]}" if off else ""
        far = max((r for r in (self.size_ratio(c.n_params) for c in controls) if r is not None), default=1.0)
        if far >= OFF_SCALE_SIZE_RATIO and not self.trust_off_scale:
            # The losses' own order error where calibration measured it (the hardest kind), else
            # unknown: the rung then keeps the top ⌈n/rf⌉ by loss, as ASHA would.
            known = [v for e in (self.ranking_error.kinds.values() if self.ranking_error else ())
                     if (v := e.loss_order_at(stop_fraction)) is not None]
            loss_scale = max(known) if known else None
            return Order(0.0, loss_scale, f"the sweep is {far:.0f}× beyond the calibrated model sizes (≥ "
                                          f"{OFF_SCALE_SIZE_RATIO:g}×): ranking by the losses at the rung, not "
                                          f"the predicted finals{where}")
        if self.ranking_error is not None and self.ranking_error.kinds:
            positions = self.ranking_error.sized(self.positions(controls), [c.n_params for c in controls])
            order = self.ranking_error.order_at(stop_fraction, kind, positions)
            return Order(order.weight, order.scale, order.words + where)
        if self.decision_error is not None:
            e = max((self.relative_error(stop_fraction, c)[0] for c in controls),
                    default=self.decision_error.at(stop_fraction))
            return Order(1.0, math.sqrt(2.0) * e, "no ranking error measured: √2·e(s), two independent "
                                                  f"predictions each off by the decision error e(s){where}")
        return Order(1.0, None, "uncalibrated predictor (no decision or ranking error)")

    def ranking_scale(
        self, stop_fraction: float, kind: str, controls: Sequence[Controls] = ()
    ) -> tuple[float, str]:
        """The ranking scale σ of :meth:`ranking_order` (0 when unknown), and its source."""
        order = self.ranking_order(stop_fraction, kind, controls)
        return (order.scale or 0.0), order.words

    @property
    def metric(self) -> str:
        """The loss the predictor was fitted on (``predictors.run_keys.METRIC_COLUMNS``):
        ``provenance["metric"]`` as ``hpo calibrate`` records it; a file without it was fitted
        on the smoothed training loss (``"loss"``)."""
        return str(self.provenance.get("metric") or DEFAULT_METRIC)

    @property
    def seed_noise(self) -> Optional[float]:
        """The seed-to-seed spread of a final loss (relative σ, measured by ``hpo calibrate``
        on configs run with several seeds), or None when not measured."""
        return None if self.ranking_error is None else self.ranking_error.seed_noise

    @property
    def size_method(self) -> str:
        """How model size enters ℓ: ``"reference curves"`` (``references`` set; the surrogate
        for runs they do not cover), ``"size term"`` (m(N), ``predictors.surrogate``) or
        ``"surrogate"`` (the paper's Eq. 4–5, no N)."""
        if self.references is not None:
            return "reference curves"
        return "size term" if self.params.has_size_term else "surrogate"

    def curve_source(self, controls: Controls) -> str:
        """Which normalised curve a run with ``controls`` is aligned to, in words."""
        if self.references is not None:
            ell, why = self.references.normalized(np.array([1.0]), controls, self._surrogate_ell)
            if ell is not None:
                return why
            return f"surrogate ({why})"
        if self.params.has_size_term:
            n = controls.n_params
            if n is None:
                return f"surrogate with size term at N_ref = {self.params.size_ref:.3g} (N not reported)"
            words = f"surrogate with size term, m(N = {n:.3g}) = {self.params.m_at(n):.4g}"
            sizes = [float(v) for v in self.provenance.get("model_sizes") or []]
            side = direction_of(float(n), sizes)
            if side is not None:  # a fitted trend continued past the sizes it was fitted on: said so
                edge, which = (max(sizes), "largest") if side == "above" else (min(sizes), "smallest")
                words += f" (the size trend extrapolated {side} the calibrated sizes, {n / edge:.2g}× the {which})"
            return words
        return "surrogate"

    def _ell_hat(self, t: np.ndarray, controls: Controls) -> np.ndarray:
        if not isinstance(controls, Controls):
            raise ValueError(f"controls: must be a Controls, got {type(controls).__name__}")
        if self.size_method != "surrogate":
            self._check_size_reported(controls)
        if self.references is not None:
            ell, _ = self.references.normalized(t, controls, self._surrogate_ell)
            if ell is not None:
                return ell
        return self._surrogate_ell(t, controls)

    def _memo_table(self, name: str) -> dict[Any, Any]:
        """One of the bounded memos (cleared when full: a sweep revisits only its own keys)."""
        table: dict[Any, Any] = self._memo[name]  # type: ignore[attr-defined]
        if len(table) > MEMO_SIZE:
            table.clear()
        return table

    def _grid_ell_hat(self, t: np.ndarray, controls: Controls) -> np.ndarray:
        """ℓ̂ at validated ``t`` (read-only), memoised by (controls, grid) for predict_final."""
        memo, key = self._memo_table("ell"), (controls, t.tobytes())
        hit = memo.get(key)
        if hit is None:
            hit = np.array(self._ell_hat(t, controls), dtype=np.float64)
            hit.flags.writeable = False
            memo[key] = hit
        elif self.size_method != "surrogate":
            self._check_size_reported(controls)  # its warning is due on a hit as on a miss
        return hit

    def _schedule_on(self, controls: Controls, t: np.ndarray) -> np.ndarray:
        """η(t̂)/η_peak on the grid ``t`` (read-only), memoised by (schedule, grid)."""
        memo, key = self._memo_table("schedule"), (controls.schedule, t.tobytes())
        hit = memo.get(key)
        if hit is None:
            hit = np.asarray(controls.schedule(t), dtype=np.float64)
            hit.flags.writeable = False
            memo[key] = hit
        return hit

    def _surrogate_ell(self, t: np.ndarray, controls: Controls) -> np.ndarray:
        """ℓ̂ of Eq. 4–5 (with the size term when fitted) at validated ``t``."""
        cache: dict[Controls, tuple[float, float, float]] = self._cache  # type: ignore[attr-defined]
        key = controls
        hit = cache.get(key)
        if hit is None:
            p = self.params
            hit = (
                float(p.b(controls.tau)),
                float(p.q(controls.tokens_per_param)),
                float(controls.schedule(1.0)),
            )
            if len(cache) > 4096:
                cache.clear()
            cache[key] = hit
        b, q, eta1 = hit
        p = self.params
        return equations.surrogate(t, self._schedule_on(controls, t), eta1, b, q, p.m_at(controls.n_params), p.eps1, p.eps2)

    @property
    def monitor_band(self) -> NoiseBand:
        """The calibrated noise band of the collapse residual, else the flat uncalibrated one."""
        return UNCALIBRATED_BAND if self.monitor is None else self.monitor

    # ------------------------------------------------------------- prediction
    def predict_final(
        self,
        t_hat: Any,
        loss: Any,
        controls: Controls,
        *,
        segment: Optional[tuple[float, float]] = None,
        smoothing_window: float = 0.0,
    ) -> Prediction:
        """Predict the final loss L(T) of a run from its (smoothed) partial curve.

        The prediction is the divisor that best aligns the observed segment with ℓ̂ on the same
        segment (paper §5 step 5), under ``self.align``; with an irreducible loss L̂ the
        reducible part L − L̂ is aligned and L(T) = L̂ + divisor. ``segment = (start, end)``
        overrides the segment (t̂ bounds; points outside are ignored). The uncertainty (1σ,
        loss units) is L(T)·sqrt(residual² + e(s)²): the RMS relative residual of the alignment
        combined with the calibrated relative error e(s) at the stop fraction s
        (:meth:`relative_error`: the cross-scale error for a run away from the calibrated
        scale; 0 when the predictor is uncalibrated).

        ``smoothing_window`` (t̂ units, optional): when the losses are a trailing mean over this
        window, ℓ̂ is averaged over the same trailing window before aligning, which removes the
        smoothing lag (large at the end of warmup; see docs/predictor.md). 0 (default) aligns
        against ℓ̂ itself.

        Raises ``ValueError`` on NaN/inf losses (a diverged run has no prediction), t̂ not
        strictly increasing in [0, 1], fewer than ``align.min_points`` points, or losses at or
        below the irreducible loss L̂.
        """
        if not isinstance(controls, Controls):  # before the memos, which key on it
            raise ValueError(f"controls: must be a Controls, got {type(controls).__name__}")
        settings = self.align
        t, y = check_curve(t_hat, loss, min_points=settings.min_points, name="predict_final")
        if segment is None:
            end = float(t[-1])
            i0, i1 = segment_indices(t, end, max(settings.min_start, settings.start_ratio * end), settings.min_points)
        else:
            start, end = check_segment(segment)
            i0 = int(np.searchsorted(t, start, side="left"))
            i1 = int(np.searchsorted(t, end, side="right"))
            if i1 - i0 < settings.min_points:
                raise ValueError(
                    f"predict_final: segment [{start:.4g}, {end:.4g}] holds {i1 - i0} points; "
                    f"needs at least {settings.min_points}"
                )
        ts, ys = t[i0:i1], y[i0:i1]
        # The batch of one (the one alignment path, :meth:`_align_segments`); ℓ̂ averaged over the
        # trailing window when the losses are smoothed (validated before the L̂ check, as always).
        ell = self._smoothed_ell_hat(ts, float(t[0]), controls, smoothing_window) if smoothing_window else None
        out = self._align_segments(ts[None, :], ys[None, :], np.ones((1, ts.size), dtype=bool), [controls],
                                   calibrated_error=True, ell=None if ell is None else ell[None, :])[0]
        if isinstance(out, ValueError):
            raise out
        return out

    def predict_finals(
        self,
        t_hat: Sequence[Any],
        loss: Sequence[Any],
        controls: Sequence[Controls],
        *,
        calibrated_error: bool = True,
    ) -> list[Union[Prediction, ValueError]]:
        """:meth:`predict_final` (its default segment, no smoothing window) for many runs in one
        vectorised pass: a rung of a 10,000-trial sweep is predicted in one call, not 10,000.

        ``t_hat[i]``, ``loss[i]``, ``controls[i]`` are run i's partial curve and controls. The
        answer holds, per run, its :class:`Prediction` or the ``ValueError`` that
        :meth:`predict_final` would raise for it (one bad run does not fail the others).
        ``calibrated_error=False`` leaves the calibrated e(s) out (the uncertainty is the
        alignment residual alone and ``error_source`` says so): for a caller that reads only
        the predicted final, since e(s) is the one part computed run by run.

        Example:
            >>> import numpy as np
            >>> p = Predictor(SurrogateParams(0.2, -0.5, 0.3, -0.1))
            >>> t = np.linspace(0.05, 0.3, 6)
            >>> c = [Controls(0.2, 20.0), Controls(0.8, 20.0)]
            >>> out = p.predict_finals([t, t], [1.7 * p.normalized_curve(t, k) for k in c], c)
            >>> [round(x.final_loss, 6) for x in out]
            [1.7, 1.7]
            >>> p.predict_finals([t], [[1.0] * 5], c[:1])[0]
            ValueError('predict_final: t_hat and loss must be 1-D arrays of one length, got shapes (6,) and (5,)')
        """
        n = len(t_hat)
        if len(loss) != n or len(controls) != n:
            raise ValueError(f"predict_finals: {n} t_hat, {len(loss)} loss and {len(controls)} controls; "
                             "one of each per run")
        if n < BATCH_FROM:
            return [self._predict_one(t, y, c, calibrated_error) for t, y, c in zip(t_hat, loss, controls)]
        settings = self.align
        out: list[Union[Prediction, ValueError, None]] = [None] * n
        rows: list[tuple[int, np.ndarray, np.ndarray]] = []
        for i, (t_i, y_i, c) in enumerate(zip(t_hat, loss, controls)):
            if not isinstance(c, Controls):
                out[i] = ValueError(f"controls: must be a Controls, got {type(c).__name__}")
                continue
            t_arr, y_arr = np.asarray(t_i, dtype=np.float64), np.asarray(y_i, dtype=np.float64)
            if t_arr.ndim != 1 or t_arr.shape != y_arr.shape or t_arr.size < settings.min_points:
                out[i] = _curve_error(t_arr, y_arr, settings.min_points)
                if out[i] is not None:
                    continue
            rows.append((i, t_arr, y_arr))
        if rows:
            self._predict_rows(rows, [controls[i] for i, _, _ in rows], out, calibrated_error)
        return out  # type: ignore[return-value]

    def _predict_one(self, t_hat: Any, loss: Any, controls: Controls, calibrated_error: bool
                     ) -> Union[Prediction, ValueError]:
        """:meth:`predict_finals` of one run by :meth:`predict_final` (its memoised ℓ̂ and error)."""
        try:
            pred = self.predict_final(t_hat, loss, controls)
        except ValueError as exc:
            return exc
        if calibrated_error:
            return pred
        return replace(pred, uncertainty=pred.final_loss * pred.residual, error_source=NO_CALIBRATED_ERROR)

    def _predict_rows(self, rows: list[tuple[int, np.ndarray, np.ndarray]], controls: list[Controls],
                      out: list[Any], calibrated_error: bool) -> None:
        """:meth:`predict_finals` for runs of the right shape: padded to one array, checked,
        aligned and assembled; each result written into ``out`` at its run's index."""
        settings = self.align
        k = np.array([t.size for _, t, _ in rows])
        width = int(k.max())
        t2, y2 = np.full((len(rows), width), 0.5), np.ones((len(rows), width))
        for j, (_, t, y) in enumerate(rows):
            t2[j, :t.size], y2[j, :t.size] = t, y
        col = np.arange(width)[None, :]
        valid = col < k[:, None]
        # check_curve's rules for every row at once; a row that breaks one gets its exact words.
        step_ok = np.where(valid[:, 1:], np.diff(t2, axis=1) > 0, True)
        bad = (~np.all(np.isfinite(t2) & np.isfinite(y2), axis=1) | np.any(t2 < -T_HAT_SLACK, axis=1)
               | np.any(t2 > 1.0 + T_HAT_SLACK, axis=1) | ~np.all(step_ok, axis=1) | np.any(y2 <= 0, axis=1))
        for j in np.flatnonzero(bad):
            i, t, y = rows[j]
            out[i] = _curve_error(t, y, settings.min_points)
            if out[i] is None:  # not an error after all (check_curve is the judge)
                bad[j] = False
        t2 = np.clip(t2, 0.0, 1.0)
        # The segment [max(min_start, start_ratio·s), s], at least min_points long (segment_indices).
        end = t2[np.arange(len(rows)), k - 1]
        start = np.maximum(settings.min_start, settings.start_ratio * end)
        i0 = np.minimum(np.sum(valid & (t2 < start[:, None]), axis=1), k - settings.min_points)
        mask = valid & (col >= i0[:, None]) & ~bad[:, None]
        for (i, _, _), pred in zip(rows, self._align_segments(t2, y2, mask, controls, calibrated_error)):
            if out[i] is None:  # a row refused above keeps check_curve's words
                out[i] = pred

    def _align_segments(self, t2: np.ndarray, y2: np.ndarray, mask: np.ndarray, controls: list[Controls],
                        calibrated_error: bool, ell: Optional[np.ndarray] = None) -> list[Union[Prediction, ValueError]]:
        """The one alignment (paper §5 step 5) of every row's segment (``mask``: its points, in
        t̂ order) with ℓ̂: the divisor under ``self.align.objective``, with an irreducible loss L̂
        the reducible part L − L̂ aligned and L(T) = L̂ + divisor; the uncertainty (1σ, loss
        units) L(T)·sqrt(residual² + e(s)²) from the RMS relative residual and the calibrated
        relative error e(s) at the stop fraction s (:meth:`relative_error`; left out unless
        ``calibrated_error``). A row with no points is ``None``; ``ell``: ℓ̂ given (smoothed)."""
        answers: list[Any] = [None] * len(mask)
        whole = bool(mask.all())  # every point of every row in its segment: no masking (a single run)
        bad = ~mask.any(axis=1)
        l0 = self.params.irreducible_loss
        if l0:
            low = (y2 if whole else np.where(mask, y2, np.inf)).min(axis=1)
            for j in np.flatnonzero(~bad & (low <= l0)):
                answers[j] = ValueError(
                    f"predict_final: loss {float(low[j]):.4g} is at or below the predictor's irreducible "
                    f"loss L̂ = {l0:.4g}; this predictor cannot describe the run")
                bad[j], whole = True, False
            mask = mask & ~bad[:, None]
        if ell is None:
            ell = self._ell_rows(t2, mask, controls, bad)
        reducible = equations.reducible_loss(y2, l0)
        if not whole:
            reducible = np.where(mask, reducible, 1.0)
        count = np.maximum(mask.sum(axis=1), 1)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            divisor = self._align_rows(reducible, ell, None if whole else mask, count, self.align.objective)
            r = reducible / divisor[:, None] - ell
            if not whole:
                r = np.where(mask, r, 0.0)
            rms = np.sqrt((r * r).sum(axis=1) / count)
        first, last = mask.argmax(axis=1), mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)  # each segment's ends
        for j in np.flatnonzero(~bad):
            d = float(divisor[j])
            if not math.isfinite(d) or d <= 0:
                answers[j] = ValueError("predict_final: alignment gave a non-finite divisor")
                continue
            final = l0 + d
            # The residual of the aligned reducible loss, expressed relative to the final loss.
            residual = float(rms[j]) * d / final
            stop, c = float(t2[j, last[j]]), controls[j]
            calibrated, source = self.relative_error(stop, c) if calibrated_error else (0.0, NO_CALIBRATED_ERROR)
            answers[j] = Prediction(
                final_loss=final, uncertainty=final * math.sqrt(residual * residual + calibrated * calibrated),
                stop_fraction=stop, segment_start=float(t2[j, first[j]]), n_points=int(count[j]),
                residual=residual, error_source=source,
                curve_source=self._curve_source_of(c) if self.size_method != "surrogate" else "surrogate")
        return answers

    def _ell_rows(self, t2: np.ndarray, mask: np.ndarray, controls: list[Controls], bad: np.ndarray) -> np.ndarray:
        """ℓ̂ on each row's segment (1 elsewhere): below ``BATCH_FROM`` rows, and for a row with
        a matching reference curve, row by row from the memo (:meth:`_grid_ell_hat`: calibration
        predicts the same curves again and again); else the surrogate (with its size term) for
        all the rows at once, by schedule."""
        ell = np.ones_like(t2)
        by_schedule: dict[Any, list[int]] = {}
        one_by_one = len(controls) < BATCH_FROM
        for j, c in enumerate(controls):
            if bad[j]:
                continue
            if one_by_one or (self.references is not None and c.n_params is not None and self._has_reference(c)):
                ell[j, mask[j]] = self._grid_ell_hat(np.ascontiguousarray(t2[j, mask[j]]), c)
                continue
            if self.size_method != "surrogate":
                self._check_size_reported(c)
            by_schedule.setdefault(c.schedule, []).append(j)
        p = self.params
        for schedule, js in by_schedule.items():
            idx = np.asarray(js)
            t = np.where(mask[idx], t2[idx], 1.0)
            tau = np.array([controls[j].tau for j in js], dtype=np.float64)[:, None]
            tpp = np.array([controls[j].tokens_per_param for j in js], dtype=np.float64)[:, None]
            m = np.array([p.m_at(controls[j].n_params) for j in js], dtype=np.float64)[:, None]
            values = equations.surrogate(t, schedule(t), float(schedule(1.0)), p.b(tau), p.q(tpp), m, p.eps1, p.eps2)
            ell[idx] = np.where(mask[idx], values, 1.0)
        return ell

    @staticmethod
    def _align_rows(reducible: np.ndarray, ell: np.ndarray, mask: Optional[np.ndarray], count: np.ndarray,
                    objective: str) -> np.ndarray:
        """``align_divisor`` of every row over its masked points (None: all of them)."""
        if objective == "log":
            logs = np.log(reducible) - np.log(ell)
            return np.exp((logs if mask is None else np.where(mask, logs, 0.0)).sum(axis=1) / count)
        if objective == "l2":
            num, den = reducible * reducible, reducible * ell
            if mask is not None:
                num, den = np.where(mask, num, 0.0), np.where(mask, den, 0.0)
            return num.sum(axis=1) / den.sum(axis=1)
        rows = range(len(reducible))
        keep = [np.ones(reducible.shape[1], dtype=bool)] * len(reducible) if mask is None else mask
        return np.array([align_divisor(reducible[j][keep[j]], ell[j][keep[j]], objective) if keep[j].any()
                         else math.nan for j in rows])

    def _has_reference(self, controls: Controls) -> bool:
        """Whether a reference curve covers ``controls`` (memoised: a sweep repeats its controls)."""
        memo = self._memo_table("reference")
        hit = memo.get(controls)
        if hit is None:
            assert self.references is not None
            hit = memo[controls] = self.references.normalized(np.array([1.0]), controls)[0] is not None
        return hit

    def _curve_source_of(self, controls: Controls) -> str:
        memo = self._memo_table("source")
        hit = memo.get(controls)
        if hit is None:
            hit = memo[controls] = self.curve_source(controls)
        return hit

    def _smoothed_ell_hat(
        self, ts: np.ndarray, t_first: float, controls: Controls, window: float
    ) -> np.ndarray:
        """Trailing mean of ℓ̂ over (t − window, t], from the first observed point on."""
        if not (math.isfinite(window) and 0.0 <= window < 1.0):
            raise ValueError(f"smoothing_window: must be in [0, 1), got {window!r}")
        k = SMOOTHING_SUBSAMPLES
        offsets = window * (np.arange(k) + 0.5) / k
        sub = ts[:, None] - offsets[None, :]
        valid = sub >= t_first
        sub = np.where(valid, sub, ts[:, None])
        ell = self._ell_hat(sub.ravel(), controls).reshape(sub.shape)
        # The newest sub-sample is always valid, so every row has at least one.
        valid[:, 0] = True
        return (ell * valid).sum(axis=1) / valid.sum(axis=1)

    def predict_curve(
        self, t_hat: Any, loss: Any, controls: Controls, t_out: Any = None
    ) -> np.ndarray:
        """The whole predicted loss curve L̂ + (L(T) − L̂)·ℓ̂(t̂) at ``t_out`` (L(T)·ℓ̂ when L̂ = 0).

        ``t_out`` defaults to ``np.linspace(0, 1, 101)``; L(T) is :meth:`predict_final`'s.
        """
        final = self.predict_final(t_hat, loss, controls).final_loss
        grid = np.linspace(0.0, 1.0, 101) if t_out is None else t_out
        return self.loss_curve(grid, controls, final)

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The JSON document written by :meth:`save` (``predictors.predictor_file``)."""
        return to_document(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "predictor") -> "Predictor":
        """Validate a document (as written by :meth:`to_dict`) and build the predictor.

        Raises ``ValueError`` naming ``source`` and the offending field.
        """
        return cls(*from_document(data, source))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the predictor as strict JSON (atomically) and return the path."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Predictor":
        """Read and validate a predictor JSON file.

        Raises ``ValueError`` with the file name and the field on a malformed file (missing
        field, wrong type, NaN/inf, out-of-range value, unknown schema version), and
        ``FileNotFoundError`` when it does not exist.
        """
        path = Path(path)
        text = path.read_text()
        try:
            data = loads_strict(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        return cls.from_dict(data, source=str(path))

    def __repr__(self) -> str:
        p = self.params
        return (
            f"Predictor(b_const={p.b_const:.4g}, b_exp={p.b_exp:.4g}, q_const={p.q_const:.4g}, "
            f"q_exp={p.q_exp:.4g}, m={p.m:.4g}{' (fitted)' if self.m_fitted else ''}, "
            f"{f'L̂={p.irreducible_loss:.4g}, ' if p.irreducible_loss else ''}"
            f"{f'm_size_exp={p.m_size_exp:.4g} (N_ref={p.size_ref:.3g}), ' if p.has_size_term else ''}"
            f"{f'references={len(self.references.curves)}, ' if self.references is not None else ''}"
            f"align={self.align.objective}@[{self.align.start_ratio}·s, s], "
            f"calibrated={self.decision_error is not None})"
        )


__all__ = ["DECISION_FRACTIONS", "SCHEMA", "SCHEMA_VERSION", "DecisionError", "NParamsMissingWarning", "Predictor",
           "package_version"]


def _curve_error(t_hat: np.ndarray, loss: np.ndarray, min_points: int) -> Optional[ValueError]:
    """The ``ValueError`` that ``check_curve`` raises for this run in ``predict_final`` (None: none)."""
    try:
        check_curve(t_hat, loss, min_points=min_points, name="predict_final")
    except ValueError as exc:
        return exc
    return None
