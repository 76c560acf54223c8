"""``CollapseScheduler``: a Ray Tune scheduler that stops trials by *predicted* final loss.

At each decision fraction ("rung", e.g. t̂ = 0.1, 0.2, 0.3 of training) every trial's partial,
smoothed loss curve is handed to the predictor (paper §5 step 5) and the trials are ranked by
their predicted final loss. The rules live in :mod:`hpo.rules` (the cut, the prediction at a
rung, the kind of sweep, the keep rule and its margin, the probability that the pick is the
best, compute accounting); this module is Ray's hooks plus the trials' state transitions.

Decision modes:

* ``sync`` (default): successive halving with pausing, like Ray's ``HyperBandScheduler``. A
  trial reaching a rung is PAUSED until every live trial has reached it; then the rung is
  decided, losers are stopped and survivors resumed. Trainables must checkpoint.
* ``async``: like ASHA; an arrival at a rung is judged against the predictions recorded there
  (:func:`hpo.rules.judge_arrival`); first arrivals continue. Never pauses.
* ``audit``: stops and pauses nothing; records what ``sync`` would have decided.

The time axis is the reported training fraction t̂ (``time_attr``), never iterations or wall
time. Each trial's controls (τ, TPP, schedule) and sweep values (η, B, λ) come from its
results, or from its config where the results lack them (``docs/design.md``).

Ray Tune does not checkpoint scheduler state, so the scheduler persists its own
(``hpo.scheduler_state``) to ``state_path`` and reloads it on construction and when unpickled
(``Tuner.restore``): decided rungs stay decided, stopped trials stay stopped.

Tested against Ray 2.60 (``TrialScheduler`` is a DeveloperAPI). Verified in its source:
``stop_trial`` on a PAUSED/PENDING trial calls ``on_trial_remove`` re-entrantly (on a RUNNING
one still saving, ``on_trial_complete``); PAUSED trials resume only through
``choose_trial_to_run``; a ``done=True`` result never reaches ``on_trial_result``
(``on_trial_complete`` gets it); ``on_trial_add`` is called again on restore and retry.
Pitfall: ``TuneConfig(max_concurrent_trials=k)`` counts PAUSED trials as live, so in sync mode
only k trials would exist at the first rung; limit concurrency with per-trial resources.

Example:
    >>> from hpo.data import default_predictor_path
    >>> from predictors import Predictor
    >>> scheduler = CollapseScheduler(predictor=Predictor.load(default_predictor_path()),
    ...                               metric="loss", mode="min", rungs=(0.1, 0.2, 0.3))
    >>> scheduler.decision_mode, scheduler.rungs
    ('sync', (0.1, 0.2, 0.3))
"""

from __future__ import annotations

import heapq
import logging
import math
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Union

from ray.tune.experiment import Trial
from ray.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler

from hpo import rules
from hpo.errors import InputError, announce, exit_2_on_uncaught
from hpo.scheduler_state import (HALTED_STATUSES, HistoryLog, RungEntry, RungRecord, SchedulerState, TrialRecord,
                                 history_path, utc_now)
from predictors.controls import Controls
from predictors.schedules import SCHEDULE_NAMES, Schedule
from predictors.curves import T_HAT_EPS
from predictors.io import finite_or_none, json_safe

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

logger = logging.getLogger(__name__)

DECISION_MODES = ("sync", "async", "audit")
DEFAULT_MIN_POINTS = rules.DEFAULT_MIN_POINTS
#: A throttled state write waits at least this many times as long as the last write took.
PERSIST_SHARE = 20
_RAY_TO_STATUS = {Trial.PENDING: "pending", Trial.RUNNING: "running", Trial.PAUSED: "paused",
                  Trial.TERMINATED: "completed", Trial.ERROR: "error"}
_ALIVE = ("pending", "running", "paused")
_OUT = ("stopped", "diverged")
#: Controls a result (or the trial's config) must carry: without them nothing can be predicted.
CONTROL_KEYS = ("tau", "tokens_per_param")
#: What a result without a schedule is taken to mean (Controls.from_mapping's defaults), said once.
SCHEDULE_DEFAULTS = {"schedule": Schedule().name, "warmup_fraction": Schedule().warmup_fraction,
                     "decay_fraction": Schedule().decay_fraction}


class SchedulerContractError(InputError):
    """A trial's results break the report contract (``docs/design.md``); names the key. An
    :class:`~hpo.errors.InputError`: the CLI prints it as one line (exit status 2)."""


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}/"))
        out[f"{prefix}{key}"] = value
        out.setdefault(str(key), value)
    return out


class _RunQueue:
    """The trials ``choose_trial_to_run`` may pick, in the controller's list order, without
    walking the list (at 10,000 trials a walk per call made Tune's loop quadratic).

    Every trial is pushed when it is added (Ray re-adds one it restores or requeues after an
    error, at the end of its list: the place is renewed), when it pauses and when a rung it
    waited at is decided; Ray's status and the scheduler's own verdict are read when an entry
    reaches the top of a heap, so entries are dropped lazily, never trusted. A trial Ray
    stages to run (PAUSED -> PENDING) is in the PENDING heap as well.
    """

    def __init__(self) -> None:
        self.trials: dict[str, Trial] = {}
        self.place: dict[str, int] = {}
        self.heaps: dict[str, list[tuple[int, str]]] = {Trial.PENDING: [], Trial.PAUSED: []}
        self._count = 0

    def add(self, trial: Trial) -> None:
        self.trials[trial.trial_id] = trial
        self.place[trial.trial_id] = self._count
        self._count += 1
        self.push(trial.trial_id)

    def push(self, trial_id: str) -> None:
        place = self.place.get(trial_id)
        if place is not None:
            for heap in self.heaps.values():
                heapq.heappush(heap, (place, trial_id))

    def first(self, status: str, may_run: Callable[[Trial], bool]) -> Optional[Trial]:
        """The first trial (list order) with Ray ``status`` that ``may_run``; entries of trials
        that are elsewhere or may not run are dropped (they are pushed again when that changes)."""
        heap = self.heaps[status]
        while heap:
            place, tid = heap[0]
            trial = self.trials.get(tid)
            if trial is not None and self.place.get(tid) == place and trial.status == status and may_run(trial):
                return trial
            heapq.heappop(heap)
        return None

    def __len__(self) -> int:
        return len(self.trials)


class CollapseScheduler(FIFOScheduler):
    """Early-stops Ray Tune trials at decision fractions by their predicted final loss.

    Every result must carry the metric and the training fraction ``time_attr`` ∈ [0, 1];
    the controls ``tau``, ``tokens_per_param``, ``schedule``, ``warmup_fraction`` come from
    the results or the trial config; ``eta``/``lr``, ``batch_size``, ``weight_decay``,
    ``n_params``, ``total_tokens`` and ``diverged`` are optional (see ``docs/design.md``).

    Args:
        predictor: an object with ``predict_final(t_hat, loss, controls)`` (``predictors.Predictor``);
            picklable. Its ``ranking_scale`` sets the calibrated margins.
        metric: the reported (smoothed) loss; None lets ``tune.TuneConfig(metric=...)`` set it.
        mode: ``"min"`` or None (set by ``TuneConfig``): the predictor predicts losses, so lower
            is better; ``"max"`` is refused.
        time_attr: the result key holding t̂.
        rungs: the decision fractions, strictly increasing in (0, 1].
        reduction_factor: at intermediate rungs the best ⌈n/rf⌉ continue (> 1).
        margin: ``"calibrated"`` (default): keep every trial whose predicted log-final is within
            ``margin_z`` × the predictor's ranking scale (for the sweep's kind, at the rung) of
            the predicted best (``hpo.rules``); or a number ≥ 0: that margin in log units
            (0.02 ≈ 2%) at every rung; 0 keeps exactly the rule's survivors.
        margin_z: the calibrated margin in ranking-scale units (default 0.25: stop a trial
            when its chance of ending better than the predicted best is below Φ(−0.25) ≈ 40%;
            ``hpo.rules.DEFAULT_MARGIN_Z`` says how it was chosen).
        tolerance: how close two final losses must be to count as the same result (loss
            units; None: the seed noise the predictor measured). A trial is kept past
            ⌈n/rf⌉ only if it could end better than the best by more; a rung whose trials
            all lie within it keeps ⌈n/rf⌉ (``hpo.rules.keep_rule``).
        decision_mode: ``"sync"``, ``"async"`` or ``"audit"``.
        state_path: where ``scheduler_state.json`` is written after every rung decision (and,
            throttled, on results); the curves go to the append-only
            ``scheduler_state.history.jsonl`` beside it. None: nothing persisted. A new scheduler
            refuses a path that holds another experiment's state unless ``resume``.
        resume: continue the experiment whose state is at ``state_path`` (its decisions,
            stopped trials and curves are kept). ``Tuner.restore`` needs no flag: the
            unpickled scheduler reloads its own file (and checks it is its experiment's).
        on_decision: called after every rung decision (sync/audit) with a JSON-safe dict:
            ``rung``, ``fraction``, ``decision_mode``, ``kept``, ``stopped`` (or would-stop),
            ``predicted_best``, ``current_best``, ``margin``, ``margin_text``, ``kind``,
            ``kept_all``, ``compute_fraction``, ``decided_at``, and ``progress`` (per rung:
            trials reached, alive, stopped, finished). Picklable; what it raises is logged.
        on_early_answer: called once with the early answer (a dict: ``trial_id``, ``config``,
            ``predicted_final_loss``, ``uncertainty``, ``probability_best``, ``margin``,
            ``margin_text``, ``kind``, ``compute_fraction``, ``rung``, ``kept``, ...). Must be
            picklable; what it raises is logged.
        min_points: fewest history points up to the rung needed to predict; a trial with fewer
            is kept and does not count towards ⌈n/rf⌉.
        persist_interval_s: least time between two throttled writes on results.

    Raises:
        ValueError: on an invalid argument, or when ``state_path`` holds a state written with
            other rungs or another decision mode.
    """

    _supports_buffered_results = False  # a trial must not overshoot the rung it pauses at

    def __init__(
        self, *, predictor: Any, metric: Optional[str] = None, mode: Optional[str] = None,
        time_attr: str = "train_fraction", rungs: Sequence[float] = (0.1, 0.2, 0.3),
        reduction_factor: float = 2, margin: Union[str, float] = "calibrated",
        margin_z: float = rules.DEFAULT_MARGIN_Z, tolerance: Optional[float] = None, decision_mode: str = "sync",
        state_path: Optional[Union[str, Path]] = None,
        on_early_answer: Optional[Callable[[Dict[str, Any]], None]] = None,
        on_decision: Optional[Callable[[Dict[str, Any]], None]] = None,
        min_points: int = DEFAULT_MIN_POINTS, persist_interval_s: float = 5.0, resume: bool = False,
    ) -> None:
        super().__init__()
        if not callable(getattr(predictor, "predict_final", None)):
            raise ValueError("predictor: must have a predict_final(t_hat, loss, controls) method")
        self._check_mode(mode)
        fractions = [float(r) for r in rungs]
        if not fractions or any(not (0.0 < r <= 1.0) for r in fractions):
            raise ValueError(f"rungs: give fractions in (0, 1], got {fractions}")
        if any(b <= a for a, b in zip(fractions, fractions[1:])):
            raise ValueError(f"rungs: must be strictly increasing, got {fractions}")
        if not (float(reduction_factor) > 1.0 and math.isfinite(float(reduction_factor))):
            raise ValueError(f"reduction_factor: must be > 1, got {reduction_factor!r}")
        if decision_mode not in DECISION_MODES:
            raise ValueError(f"decision_mode: must be one of {DECISION_MODES}, got {decision_mode!r}")
        if int(min_points) < 1:
            raise ValueError(f"min_points: must be >= 1, got {min_points!r}")
        if margin != "calibrated" and not (isinstance(margin, (int, float)) and not isinstance(margin, bool)
                                           and math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin: must be 'calibrated' or a finite number >= 0, got {margin!r}")
        if not (math.isfinite(float(margin_z)) and float(margin_z) >= 0):
            raise ValueError(f"margin_z: must be a finite number >= 0, got {margin_z!r}")
        self._predictor = predictor
        self._metric, self._mode, self._time_attr = metric, mode, time_attr
        self._rungs, self._rf = fractions, float(reduction_factor)
        if tolerance is not None and not (math.isfinite(float(tolerance)) and float(tolerance) >= 0):
            raise ValueError(f"tolerance: must be a finite loss difference >= 0, got {tolerance!r}")
        self._margin, self._z = margin, float(margin_z)
        self._tolerance = None if tolerance is None else float(tolerance)
        self._decision_mode = decision_mode
        self._state_path = Path(state_path).resolve() if state_path is not None else None
        self._on_early_answer = on_early_answer
        self._on_decision = on_decision
        self._min_points = int(min_points)
        self._persist_interval_s = float(persist_interval_s)
        self._deciding = False  # re-entrancy guard: stop_trial() calls back into this scheduler
        self._last_save = 0.0
        self._save_s = 0.0  # how long the last write took
        self._strict = False  # tests set True to re-raise internal errors
        self._controls_read: set[str] = set()  # trials whose controls this process has read
        # Per trial, (iterations_since_restore, t̂) of its last result in this process: within one
        # run of a trainable (no restore between) t̂ may never go back.
        self._session: dict[str, tuple[int, float]] = {}
        self._warned: set[str] = set()
        self._queue = _RunQueue()  # choose_trial_to_run's candidates (not persisted: Ray re-adds)
        # _rung_ready's walk, per rung: trials before the cursor (creation order) neither
        # block the rung nor can again without _reopen.
        self._ids: list[str] = []
        self._cursor: list[int] = [0] * len(fractions)
        self._history = HistoryLog(history_path(self._state_path)) if self._state_path else None
        self._history_started = False  # a fresh experiment truncates a stale history log once
        self._restored = False  # set by a load: choose_trial_to_run ends trials stopped before it
        self._state = SchedulerState(settings=self._settings(), experiment_id=uuid.uuid4().hex,
                                     rungs=[RungRecord(index=i, fraction=f) for i, f in enumerate(fractions)])
        if self._state_path is not None and self._state_path.exists() and not resume:
            other = SchedulerState.load(self._state_path).experiment_id or "unknown"
            raise ValueError(f"state_path: {self._state_path} holds the state of experiment {other}; "
                             "pass resume=True to continue it, or give a new path")
        if resume:
            if self._state_path is None or not self._state_path.exists():
                raise ValueError(f"resume: there is no state to resume at {self._state_path}")
            self._load_existing(adopt=True)

    # ------------------------------------------------------------------ settings

    @staticmethod
    def _check_mode(mode: Optional[str]) -> None:
        if mode == "max":
            raise ValueError("mode: 'max' is not supported: CollapseScheduler predicts final losses, "
                             "lower is better; report a loss and use mode='min'")
        if mode not in (None, "min"):
            raise ValueError(f"mode: must be 'min' or None, got {mode!r}")

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        """Take ``TuneConfig(metric, mode)``; False if they conflict with the constructor's."""
        if (self._metric and metric and metric != self._metric) or (self._mode and mode and mode != self._mode):
            return False
        self._check_mode(mode)
        self._metric = self._metric or metric
        self._mode = self._mode or mode
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
        return {"metric": self._metric, "mode": self._mode, "time_attr": self._time_attr,
                "rungs": list(self._rungs), "reduction_factor": self._rf, "margin": self._margin,
                "margin_z": self._z, "tolerance": self._tolerance, "decision_mode": self._decision_mode, "min_points": self._min_points}

    # ------------------------------------------------------------------ persistence

    def _load_existing(self, adopt: bool = False) -> None:
        """Load the state file (on ``resume`` and when ``Tuner.restore`` unpickles us); refuse a
        file written with other settings, or (unless adopting it) by another experiment."""
        path = self._state_path
        if path is None or not path.exists():
            return
        state = SchedulerState.load(path)
        old = state.settings
        state.check_compatible(self._settings(), str(path))
        if not adopt and state.experiment_id and state.experiment_id != self._state.experiment_id:
            raise ValueError(f"{path}: holds experiment {state.experiment_id}, not this scheduler's "
                             f"{self._state.experiment_id}")
        self._history_started = True
        self._restored = True
        self._metric = self._metric or old.get("metric")
        self._mode = self._mode or old.get("mode")
        state.settings = self._settings()
        self._state = state
        self._reindex()
        logger.info("CollapseScheduler: restored %d trials and %d decided rungs from %s",
                    len(state.trials), sum(r.decided for r in state.rungs), path)

    def _persist(self, force: bool = False) -> None:
        """Write the state (atomically); throttled unless ``force``. Never raises."""
        if self._state_path is None:
            return
        now = time.monotonic()
        # The throttle grows with the cost of a write (a 10,000-trial state takes ~1 s to write):
        # throttled writes take at most ~1/PERSIST_SHARE of the driver's time, however large
        # the sweep. Decisions are always written at once (force).
        if not force and now - self._last_save < max(self._persist_interval_s, self._save_s * PERSIST_SHARE):
            return
        try:
            self._state.settings = self._settings()
            if self._history is not None:
                self._history.flush(start=not self._history_started)
                self._history_started = True
            self._state.save(self._state_path, with_history=False)
            self._last_save = time.monotonic()
            self._save_s = self._last_save - now
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
        """``TrialScheduler.restore``: load the JSON state from ``checkpoint_path`` (checked
        against this scheduler's settings)."""
        state = SchedulerState.load(Path(checkpoint_path).resolve())
        state.check_compatible(self._settings(), str(checkpoint_path))
        self._state = state
        self._reindex()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tuner.restore unpickles the scheduler as built; the file holds what happened since.
        self.__dict__.update(state)
        self._deciding = False
        self._controls_read = set()
        self._session = {}
        self._queue = _RunQueue()  # Trial objects of the pickling process are not this one's
        self._save_s = 0.0
        self._reindex()
        if self._state_path is not None:
            self._history = HistoryLog(history_path(self._state_path))
        self._load_existing()

    # ------------------------------------------------------------------ helpers

    def _reindex(self) -> None:
        """Rebuild ``_rung_ready``'s walk for a state loaded from a file."""
        self._ids = [rec.trial_id for rec in sorted(self._state.trials.values(), key=lambda rec: rec.order)]
        self._cursor = [0] * len(self._rungs)

    def _reopen(self, trial_id: str) -> None:
        """The trial may block a rung again (alive again, or an entry of it dropped): move the
        walks back to it. Costs O(rungs); the walk from there is paid once."""
        rec = self._state.trials.get(trial_id)
        if rec is None:
            return
        for r, cursor in enumerate(self._cursor):
            if rec.order < cursor:
                self._cursor[r] = rec.order

    def _blocks(self, rec: TrialRecord, rung: RungRecord) -> bool:
        """A live trial with no (or a removed) entry at the rung: the rung must wait for it."""
        if not self._live(rec):
            return False
        entry = rung.entries.get(rec.trial_id)
        return entry is None or entry.decision == "removed"

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _is_last(self, r: int) -> bool:
        return r == len(self._rungs) - 1

    def _live(self, rec: TrialRecord) -> bool:
        """Still running (or waiting to) and in the rung competition."""
        return rec.status in _ALIVE and not self._state.eliminated(rec)

    def compute_fraction(self) -> float:
        """Σ_i t̂_i·N_i·D_i / Σ_i N_i·D_i over all trials (:func:`hpo.rules.compute_fraction`)."""
        recs = self._state.trials.values()
        return rules.compute_fraction({r.trial_id: r.last_train_fraction for r in recs},
                                      {r.trial_id: (r.n_params or 0) * (r.total_tokens or 0) for r in recs},
                                      {r.trial_id: r.redone for r in recs})

    def _margin_at(self, r: int, trial_ids: Sequence[str]) -> rules.Margin:
        """The margin of rung ``r`` for these trials (:func:`hpo.rules.rung_margin`)."""
        recs = [self._state.trials[t] for t in trial_ids if t in self._state.trials]
        return rules.rung_margin(self._predictor, self._rungs[r], [rec.sweep_values for rec in recs],
                                 [rec.controls for rec in recs if rec.controls is not None], margin=self._margin, z=self._z,
                                 tolerance=self._tolerance)

    def _entry(self, rec: TrialRecord, r: int) -> RungEntry:
        t, y = zip(*rec.history)
        pred = rules.predict_at_rung(self._predictor, t, y, rec.controls, self._rungs[r], self._min_points)
        if pred.why.startswith("predictor failed"):
            logger.warning("CollapseScheduler: prediction failed for %s: %s", rec.trial_id, pred.why)
            if self._strict:
                raise RuntimeError(pred.why)
        if pred.final_loss is not None:
            rec.latest_prediction = {"rung": self._rungs[r], "train_fraction": pred.train_fraction,
                                     "final_loss": pred.final_loss, "uncertainty": pred.uncertainty}
        return RungEntry(trial_id=rec.trial_id, train_fraction=float(pred.train_fraction or t[-1]),
                         smoothed_loss=pred.loss, n_points=pred.n_points,
                         predicted_final_loss=pred.final_loss, uncertainty=pred.uncertainty,
                         reason="" if pred.final_loss is not None else f"no prediction ({pred.why})")

    @staticmethod
    def _candidate(e: RungEntry) -> rules.Candidate:
        return rules.Candidate(e.trial_id, e.predicted_final_loss, e.smoothed_loss, e.uncertainty)

    def _words(self, r: int, keep: bool, rec: TrialRecord) -> str:
        if self._decision_mode == "audit":
            return "would_keep" if keep else "would_stop"
        if keep:
            return "keep" if self._is_last(r) else "continue"
        return "completed" if rec.status == "completed" else "stop"

    # ------------------------------------------------------------------ the rungs

    def _enter_rungs(self, tc: Optional["TuneController"], rec: TrialRecord, trigger: bool) -> bool:
        """Record the trial at every rung it has reached, in order, up to where it must wait;
        arrivals at decided rungs (and every arrival in async mode) are judged at once
        against the recorded predictions. Returns True if the trial was stopped."""
        if not rec.history:
            return False
        for r, fraction in enumerate(self._rungs):
            if rec.history[-1][0] < fraction - T_HAT_EPS:
                break
            rung = self._state.rungs[r]
            old = rung.entries.get(rec.trial_id)
            if old is not None and old.decision != "removed":
                if old.decision in ("pending", "stop", "would_stop"):
                    break
                continue
            entry = rung.entries[rec.trial_id] = self._entry(rec, r)
            if self._decision_mode != "async" and not rung.decided:
                entry.reason = entry.reason or "waiting for the rung to be decided"
                break
            recorded = [self._candidate(e) for tid, e in rung.entries.items()
                        if tid != rec.trial_id and e.decision != "pending"]
            m = self._margin_at(r, [*(c.trial_id for c in recorded), rec.trial_id])
            keep, reason = rules.judge_arrival(recorded, self._candidate(entry), last=self._is_last(r),
                                               reduction_factor=self._rf, margin=m.value, margin_words=m.words,
                                               weight=m.weight, tolerance=m.tolerance, tolerance_loss=m.tolerance_loss)
            entry.decision = self._words(r, keep, rec)
            entry.reason = ("late arrival: " if self._decision_mode != "async" else "") + reason
            entry.late, entry.decided_at, entry.compute_fraction = True, utc_now(), self.compute_fraction()
            rung.margin, rung.margin_source, rung.kind, rung.order_weight = (max(m.value - m.tolerance, 0.0), m.words,
                                                                             m.kind, m.weight)
            if keep:
                if rec.trial_id not in rung.survivors:
                    rung.survivors.append(rec.trial_id)
                if self._is_last(r) and self._decision_mode != "async" and rung.decided:
                    # Kept after the answer was announced (it errored, was retried or resumed):
                    # the answer follows the facts.
                    self._revise_early_answer(f"trial {rec.trial_id} reached t̂ = {fraction:g} after the rung was "
                                              "decided (retried after an error, or resumed) and was kept")
                continue
            if self._decision_mode == "audit":
                rec.would_stop_at = fraction
            elif rec.status != "completed":
                self._stop(tc, rec, fraction, trigger)
                return True
            break
        return False

    def _rung_ready(self, r: int) -> bool:
        """Undecided, someone waits at it, and no live trial has yet to reach it. The walk over
        the trials resumes where the last call found one that blocked (amortised O(1) per call;
        ``_reopen`` moves it back when a trial behind it may block again)."""
        rung = self._state.rungs[r]
        if rung.decided or not any(e.decision == "pending" for e in rung.entries.values()):
            return False
        if len(self._ids) != len(self._state.trials):
            self._reindex()
        ids, trials, i = self._ids, self._state.trials, self._cursor[r]
        while i < len(ids) and not self._blocks(trials[ids[i]], rung):
            i += 1
        self._cursor[r] = i
        ready = i == len(ids)
        if self._strict:  # tests: the walk must agree with the plain definition
            assert ready == all(not self._blocks(rec, rung) for rec in trials.values()), "rung readiness walk"
        return ready

    def _try_decide(self, tc: Optional["TuneController"], trigger_id: Optional[str] = None) -> None:
        """Sync/audit: decide every rung that is ready, in order (a decision may make the next
        one ready when survivors had already passed it)."""
        if self._decision_mode == "async" or self._deciding:
            return
        while True:
            r = next((i for i, rung in enumerate(self._state.rungs) if not rung.decided), None)
            if r is None or not self._rung_ready(r):
                return
            for tid in self._decide_rung(tc, r, trigger_id):
                self._enter_rungs(tc, self._state.trials[tid], trigger=(tid == trigger_id))

    def _decide_rung(self, tc: Optional["TuneController"], r: int, trigger_id: Optional[str]) -> list[str]:
        """Apply the keep rule to every trial waiting at rung ``r``; returns the survivors."""
        rung, fraction, now, compute = self._state.rungs[r], self._rungs[r], utc_now(), self.compute_fraction()
        participants: list[RungEntry] = []
        for e in (e for e in rung.entries.values() if e.decision == "pending"):
            rec = self._state.trials[e.trial_id]
            if self._decision_mode != "audit" and rec.status in HALTED_STATUSES:
                e.decision, e.reason = "removed", f"trial {rec.status} before the rung was decided"
                e.decided_at, e.compute_fraction = now, compute
            else:
                participants.append(e)
        m = self._margin_at(r, [e.trial_id for e in participants])
        decision = rules.decide([self._candidate(e) for e in participants], m, last=self._is_last(r),
                                reduction_factor=self._rf)
        to_stop: list[TrialRecord] = []
        kept = set(decision.kept)  # a membership test per participant: a set, not the list
        for e in participants:
            rec = self._state.trials[e.trial_id]
            keep = e.trial_id in kept
            e.decision = self._words(r, keep, rec)
            reason = decision.reasons[e.trial_id]
            if e.predicted_final_loss is None:
                reason = f"{e.reason}; kept" if e.reason else reason
            e.reason = reason + ("; already completed" if e.decision == "completed" else "")
            e.decided_at, e.compute_fraction = now, compute
            if not keep and self._decision_mode == "audit":
                rec.would_stop_at = fraction
            elif not keep and rec.status != "completed":
                to_stop.append(rec)
        order = {tid: rec.order for tid, rec in self._state.trials.items()}
        rung.decided, rung.decided_at, rung.compute_fraction = True, now, compute
        rung.n_participants, rung.kept_all = len(participants), decision.kept_all
        rung.survivors = sorted(decision.kept, key=order.__getitem__)
        rung.n_keep = len(rung.survivors)
        rung.predicted_best, rung.current_best = decision.predicted_best, decision.current_best
        # The margin as applied: z·σ less the tolerance (the words state both).
        rung.margin, rung.margin_source, rung.kind, rung.order_weight = decision.margin, m.words, m.kind, m.weight
        logger.info("CollapseScheduler: rung %g decided (%s): kept %d of %d: %s",
                    fraction, self._decision_mode, rung.n_keep, len(participants), rung.survivors)
        # Losers are marked stopped before the decision is persisted: a driver killed between
        # the save and the controller's stop calls must not restore them alive.
        for rec in to_stop:
            rec.status, rec.stopped_at = "stopped", fraction
        # The early answer of the last rung is written with its decision (one write, and a
        # driver killed between two writes cannot leave a decided last rung without one).
        answered = self._is_last(r) and self._compose_early_answer(r)
        self._persist(force=True)
        self._notify(self._on_decision, {
            "rung": r, "fraction": fraction, "decision_mode": self._decision_mode, "kept": list(rung.survivors),
            "stopped": [e.trial_id for e in participants if e.decision in ("stop", "would_stop")],
            "predicted_best": rung.predicted_best, "current_best": rung.current_best, "margin": rung.margin,
            "margin_text": self.margin_text(r), "kind": rung.kind, "kept_all": rung.kept_all,
            "compute_fraction": compute, "decided_at": now, "progress": self.progress()})
        for tid in rung.survivors:
            self._queue.push(tid)  # no longer waiting: may be chosen to run
        if answered:
            self._notify(self._on_early_answer, dict(self._state.early_answer or {}))
        for rec in to_stop:
            self._stop(tc, rec, fraction, trigger=(rec.trial_id == trigger_id))
        return rung.survivors

    def _notify(self, callback: Optional[Callable[[Dict[str, Any]], None]], payload: Dict[str, Any]) -> None:
        if callback is None:
            return
        try:
            callback(json_safe(payload))
        except Exception:  # noqa: BLE001 - a display/tracking hiccup must not kill the sweep
            logger.exception("CollapseScheduler: callback %s failed", getattr(callback, "__name__", callback))
            if self._strict:
                raise

    def progress(self) -> list[dict[str, Any]]:
        """Per rung: ``fraction``, ``decided``, and how many trials ``reached`` it, are
        ``alive`` past it (kept and not stopped), were ``stopped`` there and ``finished``."""
        out = []
        for rung in self._state.rungs:
            out.append({"fraction": rung.fraction, "decided": rung.decided, "reached": len(rung.entries),
                        "alive": sum(1 for t in rung.survivors if self._live(self._state.trials[t])),
                        "stopped": sum(1 for rec in self._state.trials.values() if rec.stopped_at == rung.fraction),
                        "finished": sum(1 for t in rung.survivors if self._state.trials[t].status == "completed")})
        return out

    def _stop(self, tc: Optional["TuneController"], rec: TrialRecord, fraction: float, trigger: bool) -> None:
        """Mark stopped; a trial other than the one reporting is stopped through the controller
        (a RUNNING one gets STOP on its next result)."""
        rec.status, rec.stopped_at = "stopped", fraction
        if trigger or tc is None:
            return
        # The Trial object Ray registered (found without walking its list: one walk per loser
        # was quadratic at 10,000 trials); one never registered here is looked up.
        trial = self._queue.trials.get(rec.trial_id) or next(
            (t for t in tc.get_trials() if t.trial_id == rec.trial_id), None)
        if trial is not None:
            self._terminate(tc, trial)

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

    def _revise_early_answer(self, why: str) -> None:
        """Recompute the early answer from the last rung as it stands now (a trial that errored
        or was retried, or a resumed sweep, can arrive there after it was decided and be kept);
        when it names another trial, announce it again (file, MLflow, terminal through
        ``on_early_answer``) with ``revised``: the trial it replaces, why and when."""
        old = self._state.early_answer
        if old is None:
            return
        self._state.early_answer = None
        if self._compose_early_answer(len(self._rungs) - 1, revision={"from": old.get("trial_id"), "why": why,
                                                                      "at": utc_now(), "previous": old}):
            self._announce_early_answer()
        if self._state.early_answer is None:
            self._state.early_answer = old  # nothing to rank any more: the answer stands

    def _announce_early_answer(self) -> None:
        """Write the state holding the new early answer, then hand it to ``on_early_answer``."""
        self._persist(force=True)
        self._notify(self._on_early_answer, dict(self._state.early_answer or {}))

    def _compose_early_answer(self, r: int, revision: Optional[dict[str, Any]] = None) -> bool:
        """Make the early answer from rung ``r`` (once; again only through ``_revise_early_answer``,
        which passes ``revision``); True when there is a new one to announce (a revision that
        names the same trial is not)."""
        if self._state.early_answer is not None:
            return False
        rung = self._state.rungs[r]
        kept = [rung.entries[t] for t in rung.survivors if rung.entries[t].predicted_final_loss is not None]
        if not kept:
            return False
        weight = rung.order_weight
        best = min(kept, key=lambda e: rules._rank_key(self._candidate(e), weight))
        # P(best) among the trials ranked at this rung, by the rung's order: each score
        # normal with the order's ranking scale / √2 (a pair's difference has the scale).
        ranked = [e for e in rung.entries.values() if e.predicted_final_loss is not None]
        m = self._margin_at(r, [e.trial_id for e in ranked])
        sigma = max(m.sigma, 1e-6) / math.sqrt(2)
        p_best = rules.probability_best([rules.score(self._candidate(e), weight) for e in ranked], [sigma] * len(ranked))
        probability = dict(zip([e.trial_id for e in ranked], p_best)).get(best.trial_id) if m.sigma else None
        value_error = getattr(self._predictor, "relative_error", None)
        rec = self._state.trials[best.trial_id]
        try:
            e_value = value_error(self._rungs[r], rec.controls)[0] if value_error and rec.controls else None
        except (KeyError, ValueError, TypeError):
            e_value = None
        self._state.early_answer = json_safe({
            "trial_id": best.trial_id, "config": rec.config, "predicted_final_loss": best.predicted_final_loss,
            "uncertainty": best.uncertainty, "value_error": e_value,
            "probability_best": probability, "n_candidates": len(ranked),
            "margin": rung.margin, "margin_text": self.margin_text(r), "kind": rung.kind,
            "order": m.order, "order_weight": weight, "order_words": rung.margin_source,
            "kept_all": bool(rung.kept_all), "compute_fraction": self.compute_fraction(),
            "rung": self._rungs[r], "kept": list(rung.survivors), "current_best": rung.current_best,
            "decision_mode": self._decision_mode, "decided_at": utc_now(),
        })
        if revision is not None:
            previous = revision.pop("previous")
            if previous.get("trial_id") == best.trial_id:
                self._state.early_answer = previous  # the same pick: nothing to announce again
                return False
            self._state.early_answer["revised"] = json_safe(
                {**revision, "to": best.trial_id, "previous_predicted_final_loss": previous.get("predicted_final_loss"),
                 "revisions": int((previous.get("revised") or {}).get("revisions", 0)) + 1})
            logger.warning("CollapseScheduler: early answer revised: trial %s replaces %s (%s)",
                           best.trial_id, revision["from"], revision["why"])
        return True

    def _maybe_async_early_answer(self) -> None:
        """Async: the early answer once every live trial has been judged at the last rung."""
        last = self._state.rungs[-1]
        if self._decision_mode != "async" or self._state.early_answer is not None or not last.entries:
            return
        if any(self._live(rec) and rec.trial_id not in last.entries for rec in self._state.trials.values()):
            return
        last.decided_at = last.decided_at or utc_now()
        if self._compose_early_answer(len(self._rungs) - 1):
            self._announce_early_answer()

    # ------------------------------------------------------------------ Tune hooks

    def _guard(self, fn: Callable[..., Any], default: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except SchedulerContractError as exc:
            # A broken report contract must stop the sweep with its message. Ray wraps it in a
            # TuneError of ~90 lines with the message at the bottom: say it first, in one line,
            # and let an uncaught one end the user's script with exit status 2.
            announce(exc)
            exit_2_on_uncaught()
            raise
        except Exception:  # noqa: BLE001 - otherwise the scheduler never raises into Tune's loop
            logger.exception("CollapseScheduler: internal error in %s", getattr(fn, "__name__", fn))
            if self._strict:
                raise
            return default

    def on_trial_add(self, tune_controller: "TuneController", trial: Trial) -> None:
        """Register a trial. Idempotent: restores and retries call it again for known trials."""
        if not self._metric or not self._mode:
            raise ValueError(f"{type(self).__name__} has no `metric` ({self._metric}) or `mode` "
                             f"({self._mode}); pass them to the scheduler or to `tune.TuneConfig()`")
        self._guard(self._on_add, None, trial)

    def _on_add(self, trial: Trial) -> None:
        tid = trial.trial_id
        rec = self._state.trials.get(tid)
        ray_status = getattr(trial, "status", Trial.PENDING)
        self._queue.add(trial)
        if rec is None:
            config = json_safe(dict(getattr(trial, "config", None) or {}))
            rec = self._state.trials[tid] = TrialRecord(
                trial_id=tid, order=len(self._state.trials), config=config,
                status=_RAY_TO_STATUS.get(ray_status, "pending"), sweep_values=rules.sweep_values(_flat(config)))
            if len(self._ids) == rec.order:
                self._ids.append(tid)
            self._persist()
            return
        if rec.status == "error" and ray_status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED):
            rec.status = "pending"  # retried after a failure, or resumed with resume_errored
            self._reopen(tid)
        elif rec.status in _ALIVE and ray_status == Trial.TERMINATED:
            rec.status = "completed"  # it finished before our last write
            rec.final_metric = rec.final_metric if rec.final_metric is not None else (
                rec.history[-1][1] if rec.history else None)
        elif rec.status in _ALIVE and ray_status == Trial.ERROR:
            rec.status = "error"
        self._persist()

    def on_trial_result(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> str:
        """CONTINUE, PAUSE (sync: waiting at an undecided rung) or STOP."""
        return self._guard(self._on_result, TrialScheduler.CONTINUE, tune_controller, trial, result)

    def _ingest(self, rec: TrialRecord, result: Mapping[str, Any]) -> bool:
        """Take t̂, metric, controls, sweep values and compute weights from a result; returns
        True when the trial diverged (non-finite metric or ``diverged``)."""
        if self._time_attr not in result or finite_or_none(result.get(self._time_attr)) is None:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {rec.trial_id}: result has no finite {self._time_attr!r} "
                f"(the training fraction t̂ in [0, 1]); keys: {sorted(result)[:20]}")
        t = float(result[self._time_attr])
        if not (-T_HAT_EPS <= t <= 1.0 + 1e-6):
            raise SchedulerContractError(
                f"CollapseScheduler: trial {rec.trial_id}: {self._time_attr} = {t:g} is outside [0, 1]; "
                "report the training fraction (tokens seen / total tokens), not an iteration count or a percent")
        if self._metric not in result:
            raise SchedulerContractError(f"CollapseScheduler: trial {rec.trial_id}: result has no {self._metric!r}")
        self._check_monotone(rec.trial_id, t, result.get("iterations_since_restore"))
        for key in ("n_params", "total_tokens"):
            value = finite_or_none(result.get(key))
            if value is not None and value > 0:
                setattr(rec, key, value)
        if rec.trial_id not in self._controls_read or rec.controls is None:
            # A trial's controls do not change: read them once per process (and until found).
            merged = {**_flat(rec.config), **result}
            rec.controls = self._controls(rec.trial_id, merged)
            rec.sweep_values = rules.sweep_values(merged)
            self._controls_read.add(rec.trial_id)
        value = finite_or_none(result.get(self._metric))
        if value is None or bool(result.get("diverged", False)):
            rec.status, rec.diverged_at, rec.last_train_fraction = "diverged", t, t
            logger.info("CollapseScheduler: trial %s diverged at t̂=%g", rec.trial_id, t)
            return True
        if rec.add_point(t, value, T_HAT_EPS):
            # Restored from an earlier checkpoint (or restarted: a trainable without checkpoints
            # begins again after every PAUSE): undecided rung entries made from the dropped
            # points are dropped too, and the repeated work counts in compute.
            if self._decision_mode == "sync" and t < self._rungs[0] - T_HAT_EPS:
                self._warn_once("restart", "CollapseScheduler: trial %s restarted from t̂=%.3g after a pause: "
                                "its trainable does not restore checkpoints, so sync mode trains it twice up "
                                "to each rung (use a class trainable with save/load_checkpoint, "
                                "tune.get_checkpoint(), or decision_mode='async')", rec.trial_id, t)
            for rung in self._state.rungs:
                e = rung.entries.get(rec.trial_id)
                if e is not None and e.decision == "pending" and e.train_fraction > t + T_HAT_EPS:
                    del rung.entries[rec.trial_id]
                    self._reopen(rec.trial_id)
        if self._history is not None:
            self._history.append(rec.trial_id, t, value)
        return False

    def _check_monotone(self, trial_id: str, t: float, iteration: Any) -> None:
        """Refuse t̂ going backwards within one run of a trainable. Ray counts the results since
        the last (re)start in ``iterations_since_restore``; a smaller t̂ after a restore (a
        checkpoint, or a trainable restarted after a pause) is a rewind the history handles, but
        a smaller t̂ in the same run means the trainable reports something else than the
        training fraction, and would silently rewrite the curve the rungs are decided on."""
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            return  # no Ray bookkeeping (a hand-driven scheduler): restores cannot be told apart
        last = self._session.get(trial_id)
        if last is not None and iteration > last[0] and t < last[1] - T_HAT_EPS:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {trial_id}: {self._time_attr} went back from {last[1]:g} to {t:g} "
                f"within one run of its trainable (result {iteration} since its last restore); report the "
                "training fraction, which only grows (tokens seen / total tokens)")
        self._session[trial_id] = (iteration, t)

    def _controls(self, trial_id: str, merged: Mapping[str, Any]) -> Controls:
        """A trial's controls from its result and config. Without ``tau`` or ``tokens_per_param``
        no prediction can be made and every trial would silently be kept at every rung: a
        contract error. A missing schedule or warmup takes the default, said once per sweep
        (a cosine run read as linear is predicted with the wrong shape)."""
        missing = [key for key in CONTROL_KEYS if merged.get(key) is None]
        if missing:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {trial_id}: neither its result nor its config has "
                f"{' or '.join(repr(k) for k in missing)} (the run's controls: AdamW timescale τ = B/(η·λ·D) and "
                "tokens per parameter D/N); report them in every result, or nothing can be predicted and no "
                "trial stopped")
        absent = [key for key in SCHEDULE_DEFAULTS if merged.get(key) is None
                  and (key != "decay_fraction" or merged.get("schedule") == "wsd")]
        if absent:
            assumed = ", ".join(f"{key}={SCHEDULE_DEFAULTS[key]!r}" for key in absent)
            if "schedule" in absent:
                assumed += " (warmup, then linear decay to zero)"
            self._warn_once("schedule-defaults", "CollapseScheduler: trial %s reports no %s: assuming %s for every "
                            "trial that lacks them; a run with another schedule is then predicted with the wrong "
                            "shape: report 'schedule' (one of %s) and 'warmup_fraction' in every result", trial_id,
                            " or ".join(repr(key) for key in absent), assumed, ", ".join(SCHEDULE_NAMES))
        try:
            return Controls.from_mapping(merged)
        except (KeyError, ValueError, TypeError) as exc:
            raise SchedulerContractError(f"CollapseScheduler: trial {trial_id}: unusable controls: "
                                         f"{str(exc).strip(chr(39))}") from None

    def _on_result(self, tc: "TuneController", trial: Trial, result: Dict) -> str:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            raise SchedulerContractError(
                f"CollapseScheduler: result for trial {trial.trial_id}, which was never added "
                "(on_trial_add); this scheduler instance is not the one the trial was registered with")
        if rec.status in _OUT:
            return TrialScheduler.STOP  # stopped earlier (also across a restore)
        if rec.status not in _ALIVE:
            self._reopen(rec.trial_id)  # alive again (a trial reporting after an error)
        rec.status = "running"
        if self._ingest(rec, result):
            self._try_decide(tc)
            self._maybe_async_early_answer()
            self._persist(force=True)
            return TrialScheduler.STOP
        if self._between_rungs(rec):
            self._persist()
            return TrialScheduler.CONTINUE
        stopped = self._enter_rungs(tc, rec, trigger=True)
        if not stopped:
            self._try_decide(tc, trigger_id=rec.trial_id)  # a rung decision persists itself
        self._maybe_async_early_answer()
        # Async judgements of single arrivals are persisted throttled: a lost one is made again
        # when the restored trial reaches the rung.
        self._persist()
        if rec.status == "stopped":
            return TrialScheduler.STOP
        waiting = any(e.decision == "pending" and not rung.decided
                      for rung in self._state.rungs for e in [rung.entries.get(rec.trial_id)] if e)
        # Never pause a trial that is finishing: it would run its last step twice.
        if self._decision_mode == "sync" and waiting and not result.get("done") \
                and rec.last_train_fraction < 1.0 - T_HAT_EPS:
            rec.status = "paused"
            self._queue.push(rec.trial_id)
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _between_rungs(self, rec: TrialRecord) -> bool:
        """The fast path of a result: the trial waits at no undecided rung and has not reached
        the next rung it has no entry at, so nothing can change but its history."""
        t = rec.history[-1][0]
        for rung in self._state.rungs:
            entry = rung.entries.get(rec.trial_id)
            if entry is None or entry.decision == "removed":
                return t < rung.fraction - T_HAT_EPS
            if entry.decision == "pending" and not rung.decided:
                return False
        return True

    def on_trial_complete(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> None:
        """A RUNNING trial finished or was stopped (by us, a stopper or the user)."""
        self._guard(self._on_complete, None, tune_controller, trial, result)

    def _on_complete(self, tc: "TuneController", trial: Trial, result: Optional[Dict]) -> None:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            raise SchedulerContractError(f"CollapseScheduler: trial {trial.trial_id} completed but was never added")
        if self._deciding or rec.status in _OUT:
            return  # stopped by us: persisted with the decision
        if not (result and self._ingest(rec, result)):
            rec.status = "completed"
            rec.final_metric = rec.history[-1][1] if rec.history else None
            self._enter_rungs(tc, rec, trigger=False)
        self._try_decide(tc)
        self._maybe_async_early_answer()
        # Throttled, except for the sweep's last trial: the report reads the state when it ends.
        self._persist(force=not any(r.status in _ALIVE for r in self._state.trials.values()))

    def on_trial_error(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A trial failed. Its absence must not block a rung; a retry re-adds it."""
        self._guard(self._on_gone, None, tune_controller, trial, "error")
        self._queue.push(trial.trial_id)  # Ray may requeue it PENDING

    def on_trial_remove(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A PAUSED or PENDING trial was stopped (by us via ``stop_trial``, or by Tune/user)."""
        self._guard(self._on_gone, None, tune_controller, trial, "stopped")

    def _on_gone(self, tc: "TuneController", trial: Trial, status: str) -> None:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None or self._deciding or rec.status in (*_OUT, "completed"):
            return  # our own stop_trial during a decision: the decision is persisted once
        rec.status = status
        self._try_decide(tc)
        self._maybe_async_early_answer()
        self._persist(force=True)

    def choose_trial_to_run(self, tune_controller: "TuneController") -> Optional[Trial]:
        """PENDING trials first (in creation order), then PAUSED survivors (oldest first);
        never a trial waiting at an undecided rung, nor one the scheduler has stopped."""
        trials = tune_controller.get_trials()
        if self._restored:
            # After a restore: end the trials a saved decision stopped that Ray's experiment
            # state had not caught up with when the driver died, or the sweep would wait on them.
            self._restored = False
            for trial in trials:
                rec = self._state.trials.get(trial.trial_id)
                if rec is not None and rec.status in _OUT and trial.status in (Trial.PENDING, Trial.PAUSED):
                    self._guard(self._terminate, None, tune_controller, trial)
        if len(trials) != len(self._queue):
            # Trials this instance was never told about (unpickled by Tuner.restore): index them.
            for trial in trials:
                if trial.trial_id not in self._queue.trials:
                    self._queue.add(trial)
        chosen = self._queue.first(Trial.PENDING, self._may_run) or self._queue.first(Trial.PAUSED, self._may_run)
        if chosen is not None and chosen.status == Trial.PAUSED:
            self._queue.push(chosen.trial_id)  # Ray stages it PENDING and may ask again
        if self._strict:  # tests: the queue must pick what a walk over the controller's list picks
            assert chosen is self._choose_by_walk(trials), "choose_trial_to_run queue"
        return chosen

    def _choose_by_walk(self, trials: Sequence[Trial]) -> Optional[Trial]:
        """The definition: the first PENDING trial that may run, else the first PAUSED one."""
        paused: Optional[Trial] = None
        for trial in trials:
            if trial.status == Trial.PENDING and self._may_run(trial):
                return trial
            if trial.status == Trial.PAUSED and paused is None and self._may_run(trial):
                paused = trial
        return paused

    def _may_run(self, trial: Trial) -> bool:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            return True
        if rec.status in _OUT:
            return False
        return self._decision_mode != "sync" or not any(
            e.decision == "pending" and not rung.decided
            for rung in self._state.rungs for e in [rung.entries.get(rec.trial_id)] if e)

    # ------------------------------------------------------------------ read-only views

    def trial_verdict(self, trial_id: str) -> str:
        """``completed``, ``stopped_at_<fraction>``, ``diverged``, ... (``SchedulerState.verdict``)."""
        return self._state.verdict(trial_id)

    def latest_prediction(self, trial_id: str) -> Optional[float]:
        """The trial's latest predicted final loss (from its latest rung), or None."""
        rec = self._state.trials.get(trial_id)
        return (rec.latest_prediction or {}).get("final_loss") if rec else None

    def summary(self) -> dict[str, Any]:
        """A JSON-safe snapshot for progress displays (``SchedulerState.summary``)."""
        self._state.settings = self._settings()
        return self._state.summary(self.compute_fraction())

    def margin_text(self, r: int, short: bool = False) -> str:
        """The keep-margin of rung ``r`` in words (the one it was decided with, else the one
        it would get for the trials registered now)."""
        rung = self._state.rungs[r]
        if rung.margin_source:
            margin, words = rung.margin, rung.margin_source
        else:
            m = self._margin_at(r, list(self._state.trials))
            margin, words = m.value, m.words
        if short:
            return f"{100 * margin:.2f}%"
        return f"{100 * margin:.2f}% in log-final above the predicted best at t̂ = {self._rungs[r]:g} ({words})"

    def debug_string(self) -> str:
        """One header line, then a line per rung (``SchedulerState.debug_string``)."""
        self._state.settings = self._settings()
        return self._state.debug_string()
