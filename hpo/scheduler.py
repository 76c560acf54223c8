"""``CollapseScheduler``: a Ray Tune scheduler that stops trials by *predicted* final loss.

At each decision fraction ("rung", e.g. t̂ = 0.1, 0.2, 0.3 of training) every trial's partial,
smoothed loss curve is handed to a predictor (``predict_final(t_hat, loss, controls)``, paper
§5 step 5) and the trials are ranked by their predicted final loss, not by their current loss
(paper §4/§5: "predicted best" beats "current best"). At intermediate rungs the best
⌈n/reduction_factor⌉ continue; at the last rung only the predicted best continues, plus any
trial the predictor cannot honestly rank below it: by default every trial whose predicted final
lies within the predictor's calibrated error at that fraction of the best (``margin``).

Three decision modes:

* ``sync`` (default): successive halving with pausing, like Ray's ``HyperBandScheduler``. A
  trial reaching a rung is PAUSED until every live trial has reached it; then the rung is
  decided, losers are stopped and survivors resumed. Nothing is wasted and every trial is
  judged with the same amount of evidence. Trainables must checkpoint (PAUSE = save + stop).
* ``async``: like ASHA. A trial reaching a rung is compared with the predictions already
  recorded there and stopped if it is not in the top 1/reduction_factor (at the last rung:
  if it is worse than the best recorded by more than the margin). First arrivals continue.
* ``audit``: stops and pauses nothing; records what ``sync`` would have decided
  (``would_stop`` / ``would_keep``), for measuring regret against full runs.

The time axis is the reported training fraction t̂ (``train_fraction``), never
``training_iteration`` (reset by restores without metrics) or wall time. The controls of
each trial (τ, TPP, schedule) come from its own results (``docs/design.md``).

Ray Tune does not checkpoint scheduler state, so the scheduler persists its own
(``hpo.scheduler_state``) to ``state_path``, and reloads it on construction and when
unpickled (``Tuner.restore`` unpickles the scheduler from ``tuner.pkl``): decided rungs stay
decided, stopped trials stay stopped, histories continue.

Tested against Ray 2.60.0 (``ray[tune]>=2.60,<2.61``). ``TrialScheduler`` is a Ray
*DeveloperAPI*: its hooks and the controller methods used here (``get_trials``,
``stop_trial``) may change in other versions. Verified in the 2.60 source:

* ``TuneController.stop_trial(trial)`` on a PAUSED (or PENDING) trial calls the scheduler's
  ``on_trial_remove`` re-entrantly, then schedules the stop (status TERMINATED); on a
  RUNNING trial whose PAUSE-save is still in flight (``trial.is_saving``) it calls
  ``on_trial_complete``, caches a STOP decision for the pending save and sets TERMINATED.
  ``HyperBandScheduler`` stops paused (or saving) losers the same way.
* PAUSED trials resume only through ``choose_trial_to_run`` (HyperBand un-pauses by
  returning them there). PENDING trials are started by the controller regardless.
* A result carrying ``done=True`` (or meeting a ``RunConfig(stop=...)`` criterion) is
  never shown to ``on_trial_result``: the controller STOPs and calls
  ``on_trial_complete`` with it, so the last point of a curve and a trainer's
  ``diverged`` final result arrive there.
* ``on_trial_add`` is called again on restore (for TERMINATED trials too) and after
  ``on_trial_error`` when a failed trial is retried.

Pitfall: ``TuneConfig(max_concurrent_trials=k)`` makes Ray's ``BasicVariantGenerator``
create at most k *live* trials, and PAUSED trials are live. In sync mode this means only k
trials exist when the first rung is decided; later trials are then judged late against the
recorded predictions (ASHA-like). Limit concurrency with per-trial resources instead.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Union

import numpy as np
from ray.tune.experiment import Trial
from ray.tune.result import DEFAULT_METRIC
from ray.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler

from hpo.scheduler_state import (
    RungEntry,
    RungRecord,
    SchedulerState,
    TrialRecord,
    finite_or_none,
    json_safe,
    utc_now,
)
from predictors.controls import Controls

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

logger = logging.getLogger(__name__)

DECISION_MODES = ("sync", "async", "audit")
#: Tolerance when comparing a reported t̂ with a rung fraction (t̂ = k/n is not exact in floats).
EPS = 1e-9
_RAY_TO_STATUS = {
    Trial.PENDING: "pending",
    Trial.RUNNING: "running",
    Trial.PAUSED: "paused",
    Trial.TERMINATED: "completed",
    Trial.ERROR: "error",
}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _fmt(pred: Optional[float], sigma: Optional[float]) -> str:
    if pred is None:
        return "n/a"
    return f"{pred:.4f}±{sigma:.4f}" if sigma is not None else f"{pred:.4f}±?"


#: Fewest history points (up to and including the rung point) a prediction needs by default.
DEFAULT_MIN_POINTS = 3


def predict_at_rung(
    predictor: Any,
    history: Sequence[Sequence[float]],
    controls: Optional[Mapping[str, Any]],
    upto: float,
    min_points: int = DEFAULT_MIN_POINTS,
) -> tuple[Optional[float], Optional[float], int, str]:
    """The prediction a trial gets at rung ``upto``: (final_loss, uncertainty, n_points, why-not).

    ``history`` is the trial's (t̂, smoothed loss) results in order; the points up to and
    including the first with t̂ ≥ ``upto`` are handed to ``predictor.predict_final`` with the
    trial's ``controls`` (a mapping for ``Controls.from_mapping``). Never raises: a trial with
    no controls, too few points, a failing predictor or a non-finite result gets
    ``(None, None, n, reason)`` and is kept by the scheduler. Public so that offline studies
    (``benchmarks/``) score exactly what the scheduler decides on.
    """
    points: list[list[float]] = []
    for t, v in history:
        points.append([float(t), float(v)])
        if t >= upto - EPS:
            break
    n = len(points)
    if controls is None:
        return None, None, n, "no controls (tau, tokens_per_param, schedule) in the results"
    if n < min_points:
        return None, None, n, f"only {n} point(s) up to the rung, min_points={min_points}"
    try:
        arr = np.asarray(points, dtype=np.float64)
        pred = predictor.predict_final(arr[:, 0], arr[:, 1], Controls.from_mapping(controls))
        final = finite_or_none(getattr(pred, "final_loss", None))
        sigma = finite_or_none(getattr(pred, "uncertainty", None))
    except Exception as exc:  # noqa: BLE001 - a failed prediction keeps the trial
        return None, None, n, f"predictor failed: {type(exc).__name__}: {exc}"
    if final is None:
        return None, None, n, "predictor returned a non-finite final loss"
    return final, (abs(sigma) if sigma is not None else None), n, ""


class CollapseScheduler(FIFOScheduler):
    """Early-stops Ray Tune trials at decision fractions by their predicted final loss.

    Every result must carry the report contract of ``docs/design.md``: the metric, the
    training fraction ``time_attr``, and the controls ``tau``, ``tokens_per_param``,
    ``schedule``, ``warmup_fraction`` (``decay_fraction`` for ``wsd``); optionally
    ``diverged``, ``n_params`` and ``total_tokens``.

    Args:
        predictor: any object with ``predict_final(t_hat, loss, controls) -> Prediction``
            (``predictors.Predictor``); it must be picklable (Ray pickles the scheduler).
        metric: the reported metric (the smoothed training loss). None lets
            ``tune.TuneConfig(metric=...)`` set it.
        mode: ``"min"`` or ``"max"``; None lets ``tune.TuneConfig(mode=...)`` set it.
        time_attr: the result key holding the training fraction t̂ ∈ [0, 1]. It is the only
            time axis used.
        rungs: the decision fractions, strictly increasing in (0, 1].
        reduction_factor: at intermediate rungs the best ⌈n/reduction_factor⌉ trials
            continue. Must be > 1.
        margin: the keep-margin. ``"calibrated"`` (default): at every rung s, a relative
            margin e(s)·``margin_scale`` where e(s) is the predictor's calibrated decision
            error (``Predictor.decision_error``: the measured relative error of final losses
            predicted from the first s of held-out curves). Besides the rule's survivors
            (⌈n/rf⌉ at intermediate rungs, the best at the last) every trial whose predicted
            final lies within e(s)·|pred_b| of the predicted best b is kept; when the spread
            of all predicted finals is within it, everyone is kept and the log says so. A
            predictor without ``decision_error`` gives margin 0 (with a warning).
            A number: margin in combined standard deviations, at the last rung only: keep b
            plus every j with ``pred_j − pred_b ≤ margin·sqrt(σ_j² + σ_b²)``; 0 keeps exactly
            one (ties broken by the loss at the rung, then trial id). A mapping
            ``{rung_fraction: margin}`` sets per-rung σ margins; at an intermediate rung a
            positive one additionally keeps trials within it of the ⌈n/rf⌉-th best. Rungs
            missing from the mapping use 0.
        margin_scale: multiplies the calibrated margin (ignored for σ margins); 0 turns it off.
        decision_mode: ``"sync"`` (pause until every live trial reaches the rung, then
            decide), ``"async"`` (ASHA-like, no pausing) or ``"audit"`` (never stop; record
            what sync would have done).
        state_path: where ``scheduler_state.json`` is written (atomically) after every
            decision, at trial completion and, throttled, on results. If the file exists it
            is loaded, so a restored sweep keeps its decisions. None: nothing persisted.
        on_early_answer: called once, the moment the last rung is decided, with a dict:
            ``trial_id``, ``config``, ``predicted_final_loss``, ``uncertainty``, ``margin``,
            ``compute_fraction``, ``rung``, ``kept``, ``current_best``, ``decision_mode``,
            ``decided_at``. Must be picklable. Exceptions it raises are logged, not raised.
        min_points: the fewest history points (up to and including the rung point) needed
            to predict. A trial with fewer is kept at that rung (never stopped on no
            evidence) and does not count towards ⌈n/rf⌉.
        persist_interval_s: the least time between two throttled writes on results.

    Raises:
        ValueError: on an invalid argument, or when ``state_path`` holds a state written
            with other rungs or another decision mode.
        hpo.scheduler_state.StateFileError: when ``state_path`` exists but is malformed.
    """

    # Like HyperBand: every result must be seen on its own, or a trial could overshoot a
    # rung it should have paused at.
    _supports_buffered_results = False

    def __init__(
        self,
        *,
        predictor: Any,
        metric: Optional[str] = "loss",
        mode: Optional[str] = "min",
        time_attr: str = "train_fraction",
        rungs: Sequence[float] = (0.1, 0.2, 0.3),
        reduction_factor: float = 2,
        margin: Union[str, float, Mapping[float, float]] = "calibrated",
        margin_scale: float = 1.0,
        decision_mode: str = "sync",
        state_path: Optional[Union[str, Path]] = None,
        on_early_answer: Optional[Callable[[Dict[str, Any]], None]] = None,
        min_points: int = DEFAULT_MIN_POINTS,
        persist_interval_s: float = 5.0,
    ) -> None:
        super().__init__()
        if not callable(getattr(predictor, "predict_final", None)):
            raise ValueError("predictor: must have a predict_final(t_hat, loss, controls) method")
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode: must be 'min', 'max' or None, got {mode!r}")
        fractions = [float(r) for r in rungs]
        if not fractions:
            raise ValueError("rungs: give at least one decision fraction")
        if any(not (0.0 < r <= 1.0) or not math.isfinite(r) for r in fractions):
            raise ValueError(f"rungs: every fraction must lie in (0, 1], got {fractions}")
        if any(b <= a for a, b in zip(fractions, fractions[1:])):
            raise ValueError(f"rungs: must be strictly increasing, got {fractions}")
        if not (float(reduction_factor) > 1.0 and math.isfinite(float(reduction_factor))):
            raise ValueError(f"reduction_factor: must be > 1, got {reduction_factor!r}")
        if decision_mode not in DECISION_MODES:
            raise ValueError(f"decision_mode: must be one of {DECISION_MODES}, got {decision_mode!r}")
        if int(min_points) < 1:
            raise ValueError(f"min_points: must be >= 1, got {min_points!r}")
        if not (float(margin_scale) >= 0.0 and math.isfinite(float(margin_scale))):
            raise ValueError(f"margin_scale: must be a finite number >= 0, got {margin_scale!r}")
        self._margin_scale = float(margin_scale)
        if isinstance(margin, str):
            if margin != "calibrated":
                raise ValueError(f"margin: must be 'calibrated', a number >= 0 or a mapping, got {margin!r}")
            self._margins = [0.0] * len(fractions)
            # Per rung: a relative margin (calibrated) or None (σ margins in self._margins).
            self._rel_margins, source = self._calibrated_margins(predictor, fractions)
            self._margin_sources = [source] * len(fractions)
        else:
            self._margins = self._parse_margin(margin, fractions)
            self._rel_margins = [None] * len(fractions)
            self._margin_sources = ["margin in combined standard deviations"] * len(fractions)

        self._predictor = predictor
        self._metric = metric
        self._mode = mode
        self._metric_op: Optional[float] = None
        self._set_metric_op()
        self._time_attr = time_attr
        self._rungs = fractions
        self._rf = float(reduction_factor)
        self._margin_arg = margin
        self._decision_mode = decision_mode
        self._state_path = Path(state_path) if state_path is not None else None
        self._on_early_answer = on_early_answer
        self._min_points = int(min_points)
        self._persist_interval_s = float(persist_interval_s)

        self._deciding = False  # re-entrancy guard: stop_trial() calls back into this scheduler
        self._n_decisions = 0  # bumped by every decision, to persist right after one
        self._last_save = 0.0
        self._dirty = False
        self._warned: set[str] = set()
        #: Set True in tests to re-raise internal errors instead of logging them.
        self._strict = False
        self._state = self._fresh_state()
        self._load_existing()

    # ------------------------------------------------------------------ settings

    def _calibrated_margins(self, predictor: Any, fractions: list[float]) -> tuple[list[float], str]:
        """Relative keep-margins e(s)·margin_scale from the predictor's calibrated decision error.

        e(s) is the measured relative error of the final loss predicted from the first s of
        held-out reference curves (``Predictor.decision_error``, leave-one-out RMS for the
        shipped default); a trial whose predicted final lies within it of the best cannot be
        told apart from the best honestly, so it is kept.
        """
        error = getattr(predictor, "decision_error", None)
        if error is None or not callable(getattr(error, "at", None)):
            logger.warning(
                "CollapseScheduler: margin='calibrated' but the predictor carries no decision_error; "
                "using margin 0 (keep exactly the rule's survivors)"
            )
            return [0.0] * len(fractions), "predictor has no calibrated decision error: margin 0"
        rel = [float(error.at(f)) * self._margin_scale for f in fractions]
        how = f"{getattr(error, 'source', 'calibrated')} {getattr(error, 'statistic', '')}".strip()
        scale = f" × {self._margin_scale:g}" if self._margin_scale != 1.0 else ""
        return rel, (f"the predictor's {how} decision error over {getattr(error, 'n_curves', '?')} "
                     f"calibration curves{scale}")

    def _widen_for_scale(self, r: int, trial_ids: Any) -> None:
        """A calibrated margin at rung ``r`` becomes the predictor's cross-scale error when any
        of these trials runs away from the scale the predictor was calibrated on (another TPP or
        model size: ``Predictor.relative_error``); it never narrows. The in-scale e(s) was
        measured on runs like the calibration's and understates the error elsewhere."""
        rel = self._rel_margins[r]
        error_for = getattr(self._predictor, "relative_error", None)
        if rel is None or not callable(error_for) or self._margin_scale == 0:
            return
        for tid in trial_ids:
            rec = self._state.trials.get(tid)
            if rec is None or rec.controls is None:
                continue
            try:
                error, source = error_for(self._rungs[r], Controls.from_mapping(rec.controls))
            except (KeyError, ValueError, TypeError):
                continue
            widened = float(error) * self._margin_scale
            if widened > rel * (1 + 1e-12):
                rel = self._rel_margins[r] = widened
                scale = f" × {self._margin_scale:g}" if self._margin_scale != 1.0 else ""
                self._margin_sources[r] = f"the predictor's {source}{scale}, for trial {tid}"
                logger.info("CollapseScheduler: rung %g margin widened to %.2f%% (%s)",
                            self._rungs[r], 100 * rel, self._margin_sources[r])

    @staticmethod
    def _parse_margin(margin: Any, fractions: list[float]) -> list[float]:
        """Per-rung margins (one per rung) from a float or a ``{fraction: margin}`` mapping."""
        def check(value: Any, where: str) -> float:
            value = float(value)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"margin{where}: must be a finite number >= 0, got {value!r}")
            return value

        if isinstance(margin, Mapping):
            out = [0.0] * len(fractions)
            for key, value in margin.items():
                idx = [i for i, f in enumerate(fractions) if abs(f - float(key)) <= 1e-9]
                if not idx:
                    raise ValueError(f"margin: {key!r} is not one of the rungs {fractions}")
                out[idx[0]] = check(value, f"[{key}]")
            return out
        value = check(margin, "")
        return [0.0] * (len(fractions) - 1) + [value]

    def _set_metric_op(self) -> None:
        # Like ASHA: +1 when higher is better, -1 when lower is better.
        self._metric_op = {"max": 1.0, "min": -1.0}.get(self._mode or "", None)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        """Accept ``TuneConfig(metric, mode)``; False if they conflict with the constructor's."""
        if self._metric and metric and metric != self._metric:
            return False
        if self._mode and mode and mode != self._mode:
            return False
        if mode is not None and mode not in ("min", "max"):
            return False
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        self._set_metric_op()
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        return True

    @property
    def mode(self) -> Optional[str]:
        return self._mode

    @property
    def decision_mode(self) -> str:
        return self._decision_mode

    @property
    def rungs(self) -> tuple[float, ...]:
        return tuple(self._rungs)

    @property
    def state(self) -> SchedulerState:
        """The live state (read it, do not mutate it)."""
        return self._state

    def _settings(self) -> dict[str, Any]:
        if self._rel_margins[0] is not None:
            margin: Any = "calibrated"
        elif isinstance(self._margin_arg, Mapping):
            margin = {f"{f:g}": m for f, m in zip(self._rungs, self._margins)}
        else:
            margin = float(self._margin_arg)
        return {
            "metric": self._metric,
            "mode": self._mode,
            "time_attr": self._time_attr,
            "rungs": list(self._rungs),
            "reduction_factor": self._rf,
            "margin": margin,
            "margin_scale": self._margin_scale,
            "margin_relative": [None if m is None else float(m) for m in self._rel_margins],
            "decision_mode": self._decision_mode,
            "min_points": self._min_points,
        }

    def _fresh_state(self) -> SchedulerState:
        return SchedulerState(
            settings=self._settings(),
            rungs=[RungRecord(index=i, fraction=f, margin=self._margins[i], margin_relative=self._rel_margins[i])
                   for i, f in enumerate(self._rungs)],
        )

    # ------------------------------------------------------------------ persistence

    def _load_existing(self) -> None:
        """Load ``state_path`` if it exists (restore); raise if it belongs to another setup."""
        path = self._state_path
        if path is None or not path.exists():
            return
        state = SchedulerState.load(path)
        old = state.settings
        old_rungs = [float(r) for r in old.get("rungs", [])]
        if len(old_rungs) != len(self._rungs) or any(abs(a - b) > EPS for a, b in zip(old_rungs, self._rungs)):
            raise ValueError(f"{path}: state was written with rungs {old_rungs}, not {self._rungs}")
        if old.get("decision_mode") != self._decision_mode:
            raise ValueError(
                f"{path}: state was written in decision mode {old.get('decision_mode')!r}, "
                f"not {self._decision_mode!r}"
            )
        for key in ("metric", "mode", "time_attr"):
            if old.get(key) and getattr(self, f"_{key}") and old[key] != getattr(self, f"_{key}"):
                raise ValueError(f"{path}: state was written with {key}={old[key]!r}, not {getattr(self, f'_{key}')!r}")
        if self._metric is None and old.get("metric"):
            self._metric = old["metric"]
        if self._mode is None and old.get("mode"):
            self._mode = old["mode"]
            self._set_metric_op()
        if len(state.rungs) != len(self._rungs):
            raise ValueError(f"{path}: state has {len(state.rungs)} rung records for {len(self._rungs)} rungs")
        for i, rung in enumerate(state.rungs):
            if rung.index != i:
                raise ValueError(f"{path}: rung record {i} has index {rung.index}")
        state.settings = self._settings()
        self._state = state
        logger.info(
            "CollapseScheduler: restored %d trials and %d decided rungs from %s",
            len(state.trials), sum(r.decided for r in state.rungs), path,
        )

    def _persist(self, force: bool = False) -> None:
        """Write the state (atomically); throttled unless ``force``. Never raises."""
        self._dirty = True
        if self._state_path is None:
            return
        now = time.monotonic()
        if not force and now - self._last_save < self._persist_interval_s:
            return
        try:
            self._state.settings = self._settings()
            self._state.save(self._state_path)
            self._last_save = now
            self._dirty = False
        except Exception:  # noqa: BLE001 - a failed write must not kill the sweep
            logger.exception("CollapseScheduler: could not write %s", self._state_path)
            if self._strict:
                raise

    def flush(self) -> None:
        """Write the state now (if ``state_path`` is set)."""
        self._persist(force=True)

    def save(self, checkpoint_path: str) -> None:
        """``TrialScheduler.save``: write the JSON state to ``checkpoint_path``."""
        self._state.settings = self._settings()
        self._state.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """``TrialScheduler.restore``: load the JSON state from ``checkpoint_path``."""
        self._state = SchedulerState.load(checkpoint_path)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tuner.restore unpickles the scheduler as it was when the Tuner was built; the file
        # holds what happened since.
        self.__dict__.update(state)
        self._deciding = False
        self._load_existing()

    # ------------------------------------------------------------------ helpers

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)

    def _badness(self, value: Optional[float]) -> float:
        """Lower is better, whatever the mode; None sorts last."""
        if value is None:
            return math.inf
        return -(self._metric_op or -1.0) * value

    def _rank_key(self, e: RungEntry) -> tuple[float, float, str]:
        return (self._badness(e.predicted_final_loss), self._badness(e.smoothed_loss), e.trial_id)

    @staticmethod
    def _combined_sigma(a: Optional[float], b: Optional[float]) -> float:
        return math.sqrt((a or 0.0) ** 2 + (b or 0.0) ** 2)

    def _allowed_gap(self, r: int, entry: RungEntry, anchor: RungEntry) -> tuple[float, str]:
        """How far (loss units) ``entry`` may trail ``anchor`` at rung ``r`` and be kept, and
        the margin's words for the decision log."""
        rel = self._rel_margins[r]
        if rel is not None:
            return rel * abs(anchor.predicted_final_loss or 0.0), f"calibrated margin {100 * rel:.2f}%"
        margin = self._margins[r]
        return margin * self._combined_sigma(entry.uncertainty, anchor.uncertainty), f"margin {margin:g}σ"

    def _ensure(self, trial: Trial) -> TrialRecord:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            rec = TrialRecord(
                trial_id=trial.trial_id,
                order=len(self._state.trials),
                config=json_safe(dict(getattr(trial, "config", None) or {})),
                status=_RAY_TO_STATUS.get(getattr(trial, "status", Trial.PENDING), "pending"),
            )
            self._state.trials[trial.trial_id] = rec
        return rec

    def _is_last(self, r: int) -> bool:
        return r == len(self._rungs) - 1

    def _waiting_rung(self, rec: TrialRecord) -> Optional[int]:
        """Sync/audit: the undecided rung at which the trial has a pending entry, if any."""
        for rung in self._state.rungs:
            entry = rung.entries.get(rec.trial_id)
            if entry is not None and entry.decision == "pending" and not rung.decided:
                return rung.index
        return None

    def _eliminated(self, rec: TrialRecord) -> bool:
        """Out of the rung competition: terminal, or (audit) would have been stopped."""
        if rec.status in ("stopped", "diverged", "error"):
            return True
        return self._decision_mode == "audit" and rec.would_stop_at is not None

    def compute_fraction(self) -> float:
        """Σ_i t̂_i·N_i·D_i / Σ_i N_i·D_i over all trials (equal weights unless all report N, D)."""
        recs = list(self._state.trials.values())
        if not recs:
            return 0.0
        weights = [
            (r.n_params or 0.0) * (r.total_tokens or 0.0) for r in recs
        ]
        if any(w <= 0 for w in weights):
            weights = [1.0] * len(recs)
        done = sum(min(max(r.last_train_fraction, 0.0), 1.0) * w for r, w in zip(recs, weights))
        return float(done / sum(weights))

    # ------------------------------------------------------------------ prediction

    def _predict(self, rec: TrialRecord, upto: float) -> tuple[Optional[float], Optional[float], int, str]:
        """Predict from the history up to and including the first point with t̂ ≥ ``upto``
        (:func:`predict_at_rung`); returns (final_loss, uncertainty, n_points, why-not)."""
        final, sigma, n, why = predict_at_rung(self._predictor, rec.history, rec.controls, upto, self._min_points)
        if why.startswith("predictor failed"):
            logger.warning("CollapseScheduler: prediction failed for %s: %s", rec.trial_id, why)
            if self._strict:
                raise RuntimeError(f"CollapseScheduler: {why}")
        return final, sigma, n, why

    def _make_entry(self, rec: TrialRecord, r: int) -> tuple[RungEntry, str]:
        fraction = self._rungs[r]
        t_used, loss = rec.history[-1]
        for t, v in rec.history:
            if t >= fraction - EPS:
                t_used, loss = t, v
                break
        final, sigma, n, why = self._predict(rec, fraction)
        entry = RungEntry(
            trial_id=rec.trial_id, train_fraction=t_used, smoothed_loss=loss, n_points=n,
            predicted_final_loss=final, uncertainty=sigma,
        )
        if final is not None:
            rec.latest_prediction = {
                "rung": fraction, "train_fraction": t_used, "final_loss": final, "uncertainty": sigma,
            }
        return entry, why

    # ------------------------------------------------------------------ the rules

    def _decision_words(self, r: int, keep: bool, rec: TrialRecord) -> str:
        if self._decision_mode == "audit":
            return "would_keep" if keep else "would_stop"
        if keep:
            return "keep" if self._is_last(r) else "continue"
        return "completed" if rec.status == "completed" else "stop"

    def _judge_against_recorded(self, r: int, entry: RungEntry, why: str) -> tuple[bool, str]:
        """ASHA-like: judge one arrival against the predictions recorded at rung ``r``."""
        rung = self._state.rungs[r]
        self._widen_for_scale(r, [entry.trial_id])
        if entry.predicted_final_loss is None:
            return True, f"no prediction ({why}); kept"
        recorded = [
            e for tid, e in rung.entries.items()
            if tid != entry.trial_id and e.predicted_final_loss is not None and e.decision != "pending"
        ]
        me = _fmt(entry.predicted_final_loss, entry.uncertainty)
        if not recorded:
            return True, f"predicted {me}; first prediction recorded at this rung"
        best = min(recorded, key=self._rank_key)
        if self._is_last(r):
            gap = self._badness(entry.predicted_final_loss) - self._badness(best.predicted_final_loss)
            allowed, words = self._allowed_gap(r, entry, best)
            best_s = _fmt(best.predicted_final_loss, best.uncertainty)
            if gap <= 0:
                return True, f"predicted {me} is at least as good as the best recorded {best_s} ({best.trial_id})"
            if gap <= allowed:
                return True, (f"predicted {me} is {gap:.4f} worse than the best recorded {best_s} "
                              f"({best.trial_id}), within {words} = {allowed:.4f}")
            return False, (f"predicted {me} is {gap:.4f} worse than the best recorded {best_s} "
                           f"({best.trial_id}); {words} = {allowed:.4f}")
        ranked = sorted(recorded + [entry], key=self._rank_key)
        n = len(ranked)
        k = math.ceil(n / self._rf)
        rank = ranked.index(entry)
        text = f"predicted {me} is {_ordinal(rank + 1)} of {n} recorded; keeping top {k}"
        if rank < k:
            return True, text
        # A calibrated margin is measured from the best (a trial within the prediction error
        # of the best cannot be ranked below it honestly); a σ margin from the k-th.
        anchor = ranked[0] if self._rel_margins[r] is not None else ranked[k - 1]
        allowed, words = self._allowed_gap(r, entry, anchor)
        gap = self._badness(entry.predicted_final_loss) - self._badness(anchor.predicted_final_loss)
        if allowed > 0 and gap <= allowed:
            where = "the best" if anchor is ranked[0] else f"#{k}"
            return True, text + f", and within {words} of {where}"
        return False, text

    def _enter_rungs(self, tc: Optional["TuneController"], rec: TrialRecord, trigger: bool) -> bool:
        """Record the trial at every rung it has reached, in order, up to where it must wait.

        Arrivals at decided rungs (sync late-comers, audit) and every arrival in async mode are
        judged at once against the recorded predictions. Returns True if the trial was stopped.
        """
        if not rec.history:
            return False
        last_t = rec.history[-1][0]
        for r, fraction in enumerate(self._rungs):
            if last_t < fraction - EPS:
                break
            rung = self._state.rungs[r]
            old = rung.entries.get(rec.trial_id)
            if old is not None and old.decision != "removed":
                if old.decision in ("pending", "stop", "would_stop"):
                    break
                continue
            entry, why = self._make_entry(rec, r)
            rung.entries[rec.trial_id] = entry
            if self._decision_mode != "async" and not rung.decided:
                entry.reason = (
                    "waiting for the rung to be decided" if entry.predicted_final_loss is not None
                    else f"no prediction ({why})"
                )
                break  # wait here
            keep, reason = self._judge_against_recorded(r, entry, why)
            entry.decision = self._decision_words(r, keep, rec)
            entry.reason = ("late arrival: " if self._decision_mode != "async" else "") + reason
            entry.late = True
            self._n_decisions += 1
            entry.decided_at = utc_now()
            entry.compute_fraction = self.compute_fraction()
            if keep:
                if rec.trial_id not in rung.survivors:
                    rung.survivors.append(rec.trial_id)
                continue
            if self._decision_mode == "audit":
                rec.would_stop_at = fraction
                break
            if rec.status != "completed":
                self._stop(tc, rec, fraction, trigger)
                return True
            break
        return False

    def _stop(self, tc: Optional["TuneController"], rec: TrialRecord, fraction: Optional[float], trigger: bool) -> None:
        """Mark stopped; unless it is the trial whose result is being processed (which gets
        STOP returned), ask the controller to stop it the way HyperBand does."""
        rec.status = "stopped"
        rec.stopped_at = fraction
        if trigger or tc is None:
            return
        trial = next((t for t in tc.get_trials() if t.trial_id == rec.trial_id), None)
        if trial is not None:
            self._terminate(tc, trial)
        # A RUNNING trial (not the trigger) gets STOP on its next result; TERMINATED/ERROR: done.

    def _terminate(self, tc: "TuneController", trial: Trial) -> None:
        """Have the controller end a PAUSED/PENDING (or saving) trial we have stopped."""
        if trial.status in (Trial.PAUSED, Trial.PENDING) or trial.is_saving:
            self._deciding = True
            try:
                tc.stop_trial(trial)
            except Exception:  # noqa: BLE001
                logger.exception("CollapseScheduler: stop_trial failed for %s", trial.trial_id)
                if self._strict:
                    raise
            finally:
                self._deciding = False

    def _rung_ready(self, r: int) -> bool:
        rung = self._state.rungs[r]
        if rung.decided or not any(e.decision == "pending" for e in rung.entries.values()):
            return False
        for rec in self._state.trials.values():
            if rec.status in ("pending", "running", "paused") and not self._eliminated(rec):
                entry = rung.entries.get(rec.trial_id)
                if entry is None or entry.decision == "removed":
                    return False
        return True

    def _try_decide(self, tc: Optional["TuneController"], trigger_id: Optional[str] = None) -> None:
        """Sync/audit: decide every rung that is ready, in order (a decision may make the next
        one ready when survivors had already passed it)."""
        if self._decision_mode == "async" or self._deciding:
            return
        while True:
            r = next((i for i, rung in enumerate(self._state.rungs) if not rung.decided), None)
            if r is None or not self._rung_ready(r):
                return
            survivors = self._decide_rung(tc, r, trigger_id)
            for tid in survivors:
                rec = self._state.trials[tid]
                self._enter_rungs(tc, rec, trigger=(tid == trigger_id))

    def _decide_rung(self, tc: Optional["TuneController"], r: int, trigger_id: Optional[str]) -> list[str]:
        """Apply the sync rule at rung ``r``; returns the survivors."""
        rung = self._state.rungs[r]
        fraction = self._rungs[r]
        last = self._is_last(r)
        now = utc_now()
        compute = self.compute_fraction()
        entries = [e for e in rung.entries.values() if e.decision == "pending"]
        participants: list[RungEntry] = []
        for e in entries:
            rec = self._state.trials[e.trial_id]
            if self._decision_mode != "audit" and rec.status in ("stopped", "diverged", "error"):
                e.decision, e.reason = "removed", f"trial {rec.status} before the rung was decided"
                e.decided_at, e.compute_fraction = now, compute
            else:
                participants.append(e)
        predictable = sorted((e for e in participants if e.predicted_final_loss is not None), key=self._rank_key)
        self._widen_for_scale(r, [e.trial_id for e in predictable])
        n = len(predictable)
        keep: list[RungEntry] = []
        reasons: dict[str, str] = {}
        kept_all = False
        calibrated = self._rel_margins[r] is not None
        if n:
            best = predictable[0]
            best_s = _fmt(best.predicted_final_loss, best.uncertainty)
            if last:
                keep = [best]
                reasons[best.trial_id] = f"predicted {best_s} is the best of {n}"
                anchor = best
                cut = 1
            else:
                cut = math.ceil(n / self._rf)
                keep = predictable[:cut]
                # A calibrated margin is measured from the best; a σ margin from the cut.
                anchor = best if calibrated else predictable[cut - 1]
            for i, e in enumerate(predictable):
                me = _fmt(e.predicted_final_loss, e.uncertainty)
                if not last:
                    reasons[e.trial_id] = f"predicted {me} is {_ordinal(i + 1)} of {n}; keeping top {cut}"
                if i < cut:
                    continue
                gap = self._badness(e.predicted_final_loss) - self._badness(anchor.predicted_final_loss)
                allowed, words = self._allowed_gap(r, e, anchor)
                within = allowed > 0 and gap <= allowed
                if within:
                    keep.append(e)
                if last:
                    tie = " (tie broken by the loss at the rung, then trial id)" if gap == 0 else ""
                    reasons[e.trial_id] = (
                        f"predicted {me} is {gap:.4f} worse than the best {best_s} ({best.trial_id}); "
                        f"{words} = {allowed:.4f}{tie}" + ("; keeping near-tie" if within else "")
                    )
                elif within:
                    where = "the best" if calibrated else f"#{cut}"
                    reasons[e.trial_id] += f", but within {words} of {where}"
            spread = self._badness(predictable[-1].predicted_final_loss) - self._badness(best.predicted_final_loss)
            rel = self._rel_margins[r]
            if calibrated and rel and n > 1 and spread <= rel * abs(best.predicted_final_loss):
                # Every predicted final is within the predictor's measured error of the best
                # (the loop above kept them all): no honest ranking exists; say so.
                kept_all = True
                for e in predictable:
                    reasons[e.trial_id] = (
                        f"predicted {_fmt(e.predicted_final_loss, e.uncertainty)}; calibrated error "
                        f"{100 * rel:.2f}% exceeds the spread {100 * spread / abs(best.predicted_final_loss):.2f}% "
                        f"of the {n} predicted finals: keeping everyone"
                    )
        kept_ids = {e.trial_id for e in keep}
        survivors: list[str] = []
        to_stop: list[TrialRecord] = []
        for e in participants:
            rec = self._state.trials[e.trial_id]
            if e.predicted_final_loss is None:
                ok = True
                reason = (e.reason if e.reason.startswith("no prediction") else "no prediction") + "; kept"
            else:
                ok, reason = e.trial_id in kept_ids, reasons[e.trial_id]
            e.decision = self._decision_words(r, ok, rec)
            if e.decision == "completed":
                reason += "; already completed"
            e.reason = reason
            e.decided_at, e.compute_fraction = now, compute
            if ok:
                survivors.append(e.trial_id)
            elif self._decision_mode == "audit":
                rec.would_stop_at = fraction
            elif rec.status != "completed":
                to_stop.append(rec)
        current = min(participants, key=lambda e: (self._badness(e.smoothed_loss), e.trial_id), default=None)
        rung.decided = True
        self._n_decisions += 1
        rung.decided_at = now
        rung.n_participants = len(participants)
        rung.n_keep = len(survivors)
        rung.margin = self._margins[r]
        rung.margin_relative = self._rel_margins[r]
        rung.kept_all = kept_all
        rung.survivors = sorted(survivors, key=lambda t: self._state.trials[t].order)
        rung.predicted_best = predictable[0].trial_id if predictable else None
        rung.current_best = current.trial_id if current else None
        rung.compute_fraction = compute
        logger.info(
            "CollapseScheduler: rung %g decided (%s): kept %d of %d: %s",
            fraction, self._decision_mode, len(survivors), len(participants), rung.survivors,
        )
        # Mark the losers stopped before the decision is persisted: a driver killed between
        # the save and the controller's stop calls must not restore a decided rung whose
        # losers still look alive.
        for rec in to_stop:
            rec.status, rec.stopped_at = "stopped", fraction
        if last:
            self._emit_early_answer(r)
        self._persist(force=True)
        for rec in to_stop:
            self._stop(tc, rec, fraction, trigger=(rec.trial_id == trigger_id))
        return rung.survivors

    def _emit_early_answer(self, r: int) -> None:
        if self._state.early_answer is not None:
            return
        rung = self._state.rungs[r]
        kept = [rung.entries[t] for t in rung.survivors if rung.entries[t].predicted_final_loss is not None]
        if not kept:
            return
        best = min(kept, key=self._rank_key)
        rec = self._state.trials[best.trial_id]
        answer = {
            "trial_id": best.trial_id,
            "config": rec.config,
            "predicted_final_loss": best.predicted_final_loss,
            "uncertainty": best.uncertainty,
            "margin": self._margins[r] if self._rel_margins[r] is None else self._rel_margins[r],
            "margin_kind": "relative" if self._rel_margins[r] is not None else "sigma",
            "margin_text": self.margin_text(r),
            "kept_all": bool(rung.kept_all),
            "compute_fraction": self.compute_fraction(),
            "rung": self._rungs[r],
            "kept": list(rung.survivors),
            "current_best": rung.current_best,
            "decision_mode": self._decision_mode,
            "decided_at": utc_now(),
        }
        self._state.early_answer = json_safe(answer)
        self._persist(force=True)
        if self._on_early_answer is not None:
            try:
                self._on_early_answer(dict(self._state.early_answer))
            except Exception:  # noqa: BLE001 - a display/tracking hiccup must not kill the sweep
                logger.exception("CollapseScheduler: on_early_answer failed")
                if self._strict:
                    raise

    def _maybe_async_early_answer(self) -> None:
        """Async: the early answer once every live trial has been judged at the last rung."""
        if self._decision_mode != "async" or self._state.early_answer is not None:
            return
        last = self._state.rungs[-1]
        if not last.entries:
            return
        for rec in self._state.trials.values():
            if rec.status in ("pending", "running", "paused") and rec.trial_id not in last.entries:
                return
        last.decided_at = last.decided_at or utc_now()
        self._emit_early_answer(len(self._rungs) - 1)

    # ------------------------------------------------------------------ Tune hooks

    def _guard(self, fn: Callable[..., Any], default: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - the scheduler never raises into Tune's loop
            logger.exception("CollapseScheduler: internal error in %s", getattr(fn, "__name__", fn))
            if self._strict:
                raise
            return default

    def on_trial_add(self, tune_controller: "TuneController", trial: Trial) -> None:
        """Register a trial. Idempotent: restores and retries call it again for known trials."""
        if not self._metric or not self._metric_op:
            raise ValueError(
                f"{type(self).__name__} has no valid `metric` ({self._metric}) or `mode` "
                f"({self._mode}); pass them to the scheduler or to `tune.TuneConfig()`"
            )
        self._guard(self._on_add, None, trial)

    def _on_add(self, trial: Trial) -> None:
        known = trial.trial_id in self._state.trials
        rec = self._ensure(trial)
        if not rec.config and getattr(trial, "config", None):
            rec.config = json_safe(dict(trial.config))
        if known:
            ray_status = getattr(trial, "status", None)
            if rec.status == "error" and ray_status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED):
                rec.status = "pending"  # retried after a failure, or resumed with resume_errored
            elif rec.status in ("pending", "running", "paused") and ray_status == Trial.TERMINATED:
                rec.status = "completed"  # it finished before our last write
                if rec.history and rec.final_metric is None:
                    rec.final_metric = rec.history[-1][1]
            elif rec.status in ("pending", "running", "paused") and ray_status == Trial.ERROR:
                rec.status = "error"
        self._persist(force=not known)

    def on_trial_result(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> str:
        """CONTINUE, PAUSE (sync: waiting at an undecided rung) or STOP."""
        return self._guard(self._on_result, TrialScheduler.CONTINUE, tune_controller, trial, result)

    def _ingest(self, rec: TrialRecord, result: Dict) -> tuple[Optional[float], bool]:
        """Take t̂, metric, controls and compute weights from a result.

        Returns (t̂ or None if missing, diverged?). Finite points are appended to the history.
        """
        t = finite_or_none(result.get(self._time_attr))
        if t is None:
            self._warn_once(
                "time_attr", "CollapseScheduler: result without a finite %r; ignoring it (keys: %s)",
                self._time_attr, sorted(result)[:20],
            )
            return None, False
        rec.last_train_fraction = max(rec.last_train_fraction, t) if rec.history else t
        for key in ("n_params", "total_tokens"):
            value = finite_or_none(result.get(key))
            if value is not None and value > 0:
                setattr(rec, key, value)
        try:
            rec.controls = Controls.from_mapping(result).to_dict()
        except (KeyError, ValueError, TypeError) as exc:
            self._warn_once(f"controls-{rec.trial_id}", "CollapseScheduler: trial %s: bad controls: %s",
                            rec.trial_id, exc)
        if self._metric not in result:
            self._warn_once("metric", "CollapseScheduler: result without %r; ignoring it", self._metric)
            return None, False
        value = finite_or_none(result.get(self._metric))
        if value is None or bool(result.get("diverged", False)):
            rec.status = "diverged"
            rec.diverged_at = t
            rec.last_train_fraction = t
            logger.info("CollapseScheduler: trial %s diverged at t̂=%g", rec.trial_id, t)
            return t, True
        history = rec.history
        if history and t < history[-1][0] - EPS:
            # Restored from an earlier checkpoint: drop the superseded points and any
            # undecided rung entry made from them.
            rec.history = history = [p for p in history if p[0] < t - EPS]
            for rung in self._state.rungs:
                e = rung.entries.get(rec.trial_id)
                if e is not None and e.decision == "pending" and e.train_fraction > t + EPS:
                    del rung.entries[rec.trial_id]
            rec.last_train_fraction = t
        if history and abs(t - history[-1][0]) <= EPS:
            history[-1] = [t, value]
        else:
            history.append([t, value])
        return t, False

    def _on_result(self, tc: "TuneController", trial: Trial, result: Dict) -> str:
        rec = self._ensure(trial)
        if rec.status in ("stopped", "diverged"):
            return TrialScheduler.STOP  # stopped earlier (also across a restore)
        rec.status = "running"
        t, diverged = self._ingest(rec, result)
        if diverged:
            self._try_decide(tc)
            self._maybe_async_early_answer()
            self._persist(force=True)
            return TrialScheduler.STOP
        if t is None:
            return TrialScheduler.CONTINUE
        n_decided = self._n_decisions
        stopped = self._enter_rungs(tc, rec, trigger=True)
        if not stopped:
            self._try_decide(tc, trigger_id=rec.trial_id)
        self._maybe_async_early_answer()
        self._persist(force=self._n_decisions != n_decided)
        if rec.status == "stopped":
            return TrialScheduler.STOP
        if self._decision_mode == "sync" and self._waiting_rung(rec) is not None:
            if result.get("done"):
                return TrialScheduler.CONTINUE  # finishing anyway; on_trial_complete follows
            rec.status = "paused"
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> None:
        """A RUNNING trial finished or was stopped (by us, a stopper or the user)."""
        self._guard(self._on_complete, None, tune_controller, trial, result)

    def _on_complete(self, tc: "TuneController", trial: Trial, result: Optional[Dict]) -> None:
        rec = self._ensure(trial)
        if self._deciding or rec.status in ("stopped", "diverged"):
            self._persist(force=True)
            return
        diverged = False
        if result:
            _, diverged = self._ingest(rec, result)
        if not diverged:
            rec.status = "completed"
            if rec.history:
                rec.final_metric = rec.history[-1][1]
            self._enter_rungs(tc, rec, trigger=False)
        self._try_decide(tc)
        self._maybe_async_early_answer()
        self._persist(force=True)

    def on_trial_error(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A trial failed. Its absence must not block a rung; a retry re-adds it."""
        self._guard(self._on_gone, None, tune_controller, trial, "error")

    def on_trial_remove(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A PAUSED or PENDING trial was stopped (by us via ``stop_trial``, or by Tune/user)."""
        self._guard(self._on_gone, None, tune_controller, trial, "stopped")

    def _on_gone(self, tc: "TuneController", trial: Trial, status: str) -> None:
        rec = self._ensure(trial)
        if self._deciding or rec.status in ("stopped", "diverged", "completed"):
            self._persist(force=True)
            return
        rec.status = status
        self._try_decide(tc)
        self._maybe_async_early_answer()
        self._persist(force=True)

    def choose_trial_to_run(self, tune_controller: "TuneController") -> Optional[Trial]:
        """PENDING trials first, then PAUSED survivors; never a trial waiting at an undecided
        rung, nor one the scheduler has stopped."""
        trials = list(tune_controller.get_trials())
        for trial in trials:
            rec = self._state.trials.get(trial.trial_id)
            if rec is not None and rec.status in ("stopped", "diverged") and trial.status in (
                Trial.PENDING, Trial.PAUSED
            ):
                # Stopped by a decision that Ray's own experiment state had not caught up with
                # when the driver died: end it now, or the restored sweep would wait on it.
                self._guard(self._terminate, None, tune_controller, trial)
        for trial in trials:
            if trial.status == Trial.PENDING and self._may_run(trial):
                return trial
        paused = [t for t in trials if t.status == Trial.PAUSED and self._may_run(t)]
        if not paused:
            return None
        order = {tid: rec.order for tid, rec in self._state.trials.items()}
        return min(paused, key=lambda t: order.get(t.trial_id, len(order)))

    def _may_run(self, trial: Trial) -> bool:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            return True
        if rec.status in ("stopped", "diverged"):
            return False
        return self._decision_mode != "sync" or self._waiting_rung(rec) is None

    # ------------------------------------------------------------------ read-only views

    def trial_verdict(self, trial_id: str) -> str:
        """``completed``, ``stopped_at_<fraction>``, ``diverged``, ``error``, ``stopped``,
        ``running``, ``paused``, ``pending`` or ``unknown``."""
        rec = self._state.trials.get(trial_id)
        if rec is None:
            return "unknown"
        if rec.status == "stopped" and rec.stopped_at is not None:
            return f"stopped_at_{rec.stopped_at:g}"
        return rec.status

    def latest_prediction(self, trial_id: str) -> Optional[float]:
        """The trial's latest predicted final loss (from its latest rung), or None."""
        rec = self._state.trials.get(trial_id)
        if rec is None or not rec.latest_prediction:
            return None
        return rec.latest_prediction.get("final_loss")

    def summary(self) -> dict[str, Any]:
        """A JSON-safe snapshot for progress displays.

        Keys: ``decision_mode``, ``metric``, ``mode``, ``rungs`` (fractions),
        ``trials`` (by id: ``status``, ``verdict``, ``train_fraction``, ``loss`` (latest
        reported metric), ``predicted_final_loss``, ``uncertainty``, ``prediction_rung``,
        ``stopped_at``, ``would_stop_at``, ``final_metric``, ``config``),
        ``rung_status`` (per rung: ``fraction``, ``decided``, ``n_reached``,
        ``n_participants``, ``survivors``, ``predicted_best``, ``current_best``,
        ``compute_fraction``), ``predicted_best`` (``trial_id``, ``predicted_final_loss``,
        ``uncertainty``, ``rung``; among trials still in the race, the best prediction at the
        highest rung reached), ``current_best`` (``trial_id``, ``loss``,
        ``train_fraction``: the lowest latest metric among trials not stopped or diverged),
        ``compute_fraction`` and ``early_answer``.
        """
        trials: dict[str, Any] = {}
        for tid, rec in sorted(self._state.trials.items(), key=lambda kv: kv[1].order):
            lp = rec.latest_prediction or {}
            trials[tid] = {
                "status": rec.status,
                "verdict": self.trial_verdict(tid),
                "train_fraction": rec.last_train_fraction,
                "loss": rec.history[-1][1] if rec.history else None,
                "predicted_final_loss": lp.get("final_loss"),
                "uncertainty": lp.get("uncertainty"),
                "prediction_rung": lp.get("rung"),
                "stopped_at": rec.stopped_at,
                "would_stop_at": rec.would_stop_at,
                "final_metric": rec.final_metric,
                "config": rec.config,
            }
        rung_status = [
            {
                "fraction": rung.fraction,
                "decided": rung.decided,
                "n_reached": len(rung.entries),
                "n_participants": rung.n_participants,
                "survivors": list(rung.survivors),
                "predicted_best": rung.predicted_best,
                "current_best": rung.current_best,
                "compute_fraction": rung.compute_fraction,
            }
            for rung in self._state.rungs
        ]
        in_race = [
            rec for rec in self._state.trials.values()
            if rec.latest_prediction and not self._eliminated(rec) and rec.status != "error"
        ]
        predicted_best = None
        if in_race:
            rung_pos = {f: i for i, f in enumerate(self._rungs)}
            best = min(in_race, key=lambda rec: (
                -rung_pos.get(rec.latest_prediction["rung"], -1),
                self._badness(rec.latest_prediction["final_loss"]), rec.order))
            predicted_best = {
                "trial_id": best.trial_id,
                "predicted_final_loss": best.latest_prediction["final_loss"],
                "uncertainty": best.latest_prediction["uncertainty"],
                "rung": best.latest_prediction["rung"],
            }
        alive = [rec for rec in self._state.trials.values()
                 if rec.history and rec.status not in ("stopped", "diverged", "error")]
        current_best = None
        if alive:
            cb = min(alive, key=lambda rec: (self._badness(rec.history[-1][1]), rec.order))
            current_best = {"trial_id": cb.trial_id, "loss": cb.history[-1][1],
                            "train_fraction": cb.history[-1][0]}
        return json_safe({
            "decision_mode": self._decision_mode,
            "metric": self._metric,
            "mode": self._mode,
            "rungs": list(self._rungs),
            "trials": trials,
            "rung_status": rung_status,
            "predicted_best": predicted_best,
            "current_best": current_best,
            "compute_fraction": self.compute_fraction(),
            "early_answer": self._state.early_answer,
        })

    def margin_text(self, r: int, short: bool = False) -> str:
        """The keep-margin at rung ``r`` in words (stated with the early answer and in logs)."""
        rel = self._rel_margins[r]
        if rel is None:
            return f"{self._margins[r]:g}σ" if short else f"{self._margins[r]:g} combined standard deviations"
        if short:
            return f"{100 * rel:.2f}%"
        return (f"{100 * rel:.2f}% of the predicted best at t̂ = {self._rungs[r]:g} "
                f"({self._margin_sources[r]})")

    def debug_string(self) -> str:
        """One header line, then a line per rung: decided? survivors."""
        recs = list(self._state.trials.values())
        count = {s: sum(r.status == s for r in recs) for s in ("stopped", "diverged", "completed", "error")}
        margin = ",".join(self.margin_text(i, short=True) for i in range(len(self._rungs)))
        lines = [
            f"Using CollapseScheduler ({self._decision_mode}; {self._metric} {self._mode}; "
            f"rf={self._rf:g}; margin={margin}): {len(recs)} trials, {count['stopped']} stopped, "
            f"{count['diverged']} diverged, {count['completed']} completed, {count['error']} errored"
        ]
        for rung in self._state.rungs:
            if rung.decided:
                state = (f"decided, kept {len(rung.survivors)}/{rung.n_participants} "
                         f"[{', '.join(rung.survivors)}], predicted best {rung.predicted_best}")
            elif self._decision_mode == "async":
                kept = sum(e.decision in ("continue", "keep") for e in rung.entries.values())
                state = f"{len(rung.entries)} judged, {kept} kept"
            else:
                live = sum(1 for r in recs if r.status in ("pending", "running", "paused") and not self._eliminated(r))
                state = f"waiting ({len(rung.entries)} reached, {live} live)"
            lines.append(f"  rung {rung.fraction:g}: {state}")
        return "\n".join(lines)
