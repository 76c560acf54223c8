"""``CollapseScheduler``: a Ray Tune scheduler that stops trials by *predicted* final loss.

At each decision fraction ("rung", e.g. t̂ = 0.1, 0.2, 0.3 of training) every trial's partial,
smoothed loss curve is handed to the predictor (paper §5 step 5) and the trials are ranked by
their predicted final loss, by the configured keep rule (:mod:`hpo.decisions.keep`: evidence in,
a decision out). This module is what Ray Tune calls (``TrialScheduler``'s hooks) and
when to decide; around it, one concept each: ``hpo.decisions.scheduler_judge`` (the rules applied at a
rung), ``hpo.decisions.scheduler_records``/``hpo.decisions.scheduler_state`` (trials, rungs, their transitions and
their file), ``hpo.decisions.scheduler_contract`` (what a result must carry), ``hpo.decisions.scheduler_queue``
(which trial runs next) and ``hpo.decisions.early_answer`` (what the answer says).

Decision modes: ``sync`` (default), successive halving with pausing like Ray's
``HyperBandScheduler``: a trial reaching a rung is PAUSED until every live trial has reached it,
then losers are stopped and survivors resumed (trainables must checkpoint); ``async``, like ASHA:
an arrival is judged against the predictions recorded at the rung
(``KeepRule.judge_arrival``), first arrivals continue, nothing pauses; ``audit``:
stops and pauses nothing, records what ``sync`` would have decided.

The time axis is the reported training fraction t̂ (``time_attr``), never iterations or wall
time. Each trial's controls (τ, TPP, schedule) and sweep values (η, B, λ) come from its
results, or from its config where the results lack them (``docs/design.md``).

Ray Tune does not checkpoint scheduler state, so the scheduler persists its own
(``hpo.decisions.scheduler_state``) to ``state_path`` and reloads it on construction and when unpickled
(``Tuner.restore``): decided rungs stay decided, stopped trials stay stopped.

Tested against Ray 2.60 (``TrialScheduler`` is a DeveloperAPI); the hook behaviour this relies
on, verified in its source, is in ``docs/design.md`` ("The scheduler and Ray Tune").

Example:
    >>> from hpo.data import default_predictor_path
    >>> from predictors import Predictor
    >>> scheduler = CollapseScheduler(predictor=Predictor.load(default_predictor_path()),
    ...                               settings=SchedulerSettings(rungs=[0.1, 0.2, 0.3]))
    >>> scheduler.decision_mode, scheduler.rungs
    ('sync', (0.1, 0.2, 0.3))
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Union

from ray.tune.experiment import Trial
from ray.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler

from hpo.decisions.early_answer import compose_early_answer, revise
from hpo.decisions.scheduler_contract import (ReportReader, SchedulerContractError, SchedulerSettings, check_mode,
                                              guarded, notify)
from hpo.decisions.keep import KeepRule
from hpo.decisions.scheduler_judge import RungJudge
from hpo.decisions.scheduler_queue import RunQueue, first_by_walk
from hpo.decisions.scheduler_state import (RungDecision, RungRecord, RungWalk, SchedulerState, StateStore, TrialRecord,
                                 TrialStatus, utc_now)
from predictors.curves import T_HAT_EPS
from predictors.io import json_safe

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

logger = logging.getLogger(__name__)

__all__ = ["CollapseScheduler", "SchedulerSettings"]  # what it decides with, importable beside it

#: Ray's trial status as the scheduler's (TERMINATED: finished, unless a rung stopped it).
_RAY_TO_STATUS = {Trial.PENDING: TrialStatus.PENDING, Trial.RUNNING: TrialStatus.RUNNING,
                  Trial.PAUSED: TrialStatus.PAUSED, Trial.TERMINATED: TrialStatus.COMPLETED,
                  Trial.ERROR: TrialStatus.ERROR}


class CollapseScheduler(FIFOScheduler):
    """Early-stops Ray Tune trials at decision fractions by their predicted final loss.

    What a result must carry (the metric, t̂, the controls; ``eta``/``lr``, ``batch_size``,
    ``weight_decay``, ``n_params``, ``total_tokens``, ``diverged`` optional): ``hpo.decisions.scheduler_contract``.

    Args:
        predictor: has ``predict_final(t_hat, loss, controls)`` (``predictors.Predictor``);
            picklable. Its ``ranking_scale`` sets the calibrated margins.
        settings: what it decides with (``SchedulerSettings``, the sweep config's ``scheduler:``,
            checked there once): the metric (a loss: lower is better), the rungs (decision
            fractions), reduction factor, margin, tolerance, decision mode (``mode``: ``"sync"``,
            ``"async"`` or ``"audit"``), the keep rule and its knobs, ``min_points``. Default:
            ``SchedulerSettings()``.
        rule: a keep rule object (``hpo.decisions.keep.KeepRule``) to apply instead of the one
            ``settings.rule`` names; ``rule.settings()`` is what the state file records.
        state_path: where ``scheduler_state.json`` is written after every rung decision (and,
            throttled, on results), the curves appended to ``scheduler_state.history.jsonl``
            beside it; None: nothing persisted. A path holding another experiment's state is
            refused unless ``resume``.
        resume: continue the experiment whose state is at ``state_path``. ``Tuner.restore`` needs
            no flag: the unpickled scheduler reloads its own file.
        on_decision: called after every rung decision (sync/audit) with a JSON-safe dict
            (``RungRecord.announcement``: kept, stopped, bests, margin, kind, compute, progress).
        on_early_answer: called with the early answer (``hpo.decisions.early_answer.compose_early_answer``),
            again only when a revision names another trial.
            Both callbacks must be picklable; what they raise is logged.
        time_attr: the result key holding t̂.
        persist_interval_s: least time between two throttled writes on results.

    Raises:
        ValueError: on a predictor without ``predict_final``, or when ``state_path`` holds a state
            written with other settings (rungs, decision mode, rule knobs, ...).
    """

    _supports_buffered_results = False  # a trial must not overshoot the rung it pauses at

    def __init__(
        self, *, predictor: Any, settings: Optional[SchedulerSettings] = None, rule: Optional[KeepRule] = None,
        state_path: Optional[Union[str, Path]] = None, resume: bool = False,
        on_early_answer: Optional[Callable[[Dict[str, Any]], None]] = None,
        on_decision: Optional[Callable[[Dict[str, Any]], None]] = None,
        time_attr: str = "train_fraction", persist_interval_s: float = 5.0,
    ) -> None:
        super().__init__()
        if not callable(getattr(predictor, "predict_final", None)):
            raise ValueError("predictor: must have a predict_final(t_hat, loss, controls) method")
        settings = settings if settings is not None else SchedulerSettings()
        if rule is not None:  # the rule object decides; the settings record its knobs
            settings = settings.model_copy(update={"rule": rule.settings()})
        # Ray's mode is always "min": the predicted finals are losses (set_search_properties refuses "max").
        self._metric, self._mode, self._time_attr = settings.metric, "min", time_attr
        self._rungs, self._decision_mode = tuple(settings.rungs), settings.mode
        self._judge = RungJudge(predictor, settings, rule if rule is not None else settings.keep_rule())
        self._state_path = Path(state_path).resolve() if state_path is not None else None
        self._on_early_answer, self._on_decision = on_early_answer, on_decision
        self._deciding = False  # re-entrancy guard: stop_trial() calls back into this scheduler
        self._reader = ReportReader(time_attr)
        self._store = StateStore(self._state_path, persist_interval_s)
        self._queue = RunQueue()  # choose_trial_to_run's candidates (not persisted: Ray re-adds)
        self._walk = RungWalk(len(self._rungs))
        self._restored = False  # set by a load: choose_trial_to_run ends trials stopped before it
        self._state = SchedulerState(settings=self._settings(), experiment_id=uuid.uuid4().hex,
                                     rungs=[RungRecord(index=i, fraction=f) for i, f in enumerate(self._rungs)])
        if self._store.check_start(resume):
            self._load_existing(adopt=True)

    # ------------------------------------------------------------------ settings (Ray: TuneConfig)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        """Take ``TuneConfig(metric, mode)``: False (Ray then refuses them) for another metric
        than the settings'; ``mode="max"`` is refused with the reason."""
        check_mode(mode)
        return metric in (None, self._metric)

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
    def _strict(self) -> bool:
        """Tests set it: internal errors (and failed predictions) raise instead of being logged."""
        return self._judge.strict

    @_strict.setter
    def _strict(self, value: bool) -> None:
        self._judge.strict = value

    @property
    def state(self) -> SchedulerState:
        """The live state (read it, do not mutate it)."""
        return self._state

    def _settings(self) -> dict[str, Any]:
        return {"metric": self._metric, "mode": self._mode, "time_attr": self._time_attr, **self._judge.recorded_settings()}

    # ------------------------------------------------------------------ persistence (Ray keeps none)

    def _load_existing(self, adopt: bool = False) -> None:
        """Load the state file (on ``resume`` and when ``Tuner.restore`` unpickles us); refuse a
        file written with other settings, or (unless adopting it) by another experiment."""
        if self._state_path is None or not self._state_path.exists():
            return
        state = self._store.load(self._settings(), None if adopt else self._state.experiment_id)
        self._restored = True
        state.settings = self._settings()
        self._state = state
        self._walk.reindex(state)
        logger.info("CollapseScheduler: restored %d trials and %d decided rungs from %s",
                    len(state.trials), sum(r.decided for r in state.rungs), self._state_path)

    def _persist(self, force: bool = False) -> None:
        """Write the state (``StateStore.save``: throttled unless ``force``; never raises)."""
        self._state.settings = self._settings()
        self._store.save(self._state, force=force, strict=self._strict)

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
        self._walk.reindex(state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tuner.restore unpickles the scheduler as built; the file holds what happened since.
        self.__dict__.update(state)
        self._deciding = False
        self._reader.reset()
        self._queue = RunQueue()  # Trial objects of the pickling process are not this one's
        self._store.reopen()
        self._walk.reindex(self._state)
        self._load_existing()

    # ------------------------------------------------------------------ the rungs

    def compute_fraction(self) -> float:
        """Σ_i t̂_i·N_i·D_i / Σ_i N_i·D_i over all trials (:func:`predictors.curves.compute_fraction`)."""
        return self._state.compute_fraction()

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
            if old is not None and old.decision != RungDecision.REMOVED:
                if old.decision.ends_here:
                    break
                continue
            if self._decision_mode != "async" and not rung.decided:
                # Predicted when the rung is decided, with every trial waiting there (one batch).
                rung.entries[rec.trial_id] = self._judge.waiting_entry(rec, r)
                break
            entry = rung.entries[rec.trial_id] = self._judge.entry(rec, r)
            keep = self._judge.judge_arrival(rung, entry, rec, self._state.trials, utc_now(), self.compute_fraction(),
                                             self._previous(r))
            if keep and self._judge.is_last(r) and self._decision_mode != "async" and rung.decided:
                # Kept after the answer was announced (it errored, was retried or resumed):
                # the answer follows the facts.
                self._revise_early_answer(f"trial {rec.trial_id} reached t̂ = {fraction:g} after the rung was "
                                          "decided (retried after an error, or resumed) and was kept")
            if not keep:
                if self._decision_mode == "audit":
                    rec.would_stop_at = fraction
                elif rec.status != TrialStatus.COMPLETED:
                    self._stop(tc, rec, fraction, trigger)
                    return True
                break
        return False

    def _try_decide(self, tc: Optional["TuneController"], trigger_id: Optional[str] = None) -> None:
        """Sync/audit: decide every rung that is ready, in order (a decision may make the next
        one ready when survivors had already passed it)."""
        if self._decision_mode == "async" or self._deciding:
            return
        while True:
            r = next((i for i, rung in enumerate(self._state.rungs) if not rung.decided), None)
            if r is None or not self._walk.ready(self._state, r, check=self._strict):
                return
            for tid in self._decide_rung(tc, r, trigger_id):
                self._enter_rungs(tc, self._state.trials[tid], trigger=(tid == trigger_id))

    def _decide_rung(self, tc: Optional["TuneController"], r: int, trigger_id: Optional[str]) -> list[str]:
        """Apply the keep rule to every trial waiting at rung ``r``; returns the survivors."""
        rung, fraction, now, compute = self._state.rungs[r], self._rungs[r], utc_now(), self.compute_fraction()
        participants = self._state.remove_halted(rung, now, compute)
        to_stop = self._judge.decide(rung, participants, self._state.trials, now, compute, self._previous(r))
        logger.info("CollapseScheduler: rung %g decided (%s): kept %d of %d: %s",
                    fraction, self._decision_mode, rung.n_keep, len(participants), rung.survivors)
        # Losers are marked stopped before the decision is persisted: a driver killed between
        # the save and the controller's stop calls must not restore them alive. The last rung's
        # early answer is written with it (one write; no decided last rung without an answer).
        for rec in to_stop:
            self._state.stop(rec, fraction)
        answered = self._judge.is_last(r) and self._compose_early_answer()
        self._persist(force=True)
        self._notify(self._on_decision, rung.announcement(self._decision_mode, participants, self.margin_text(r),
                                                          self.progress()))
        for tid in rung.survivors:
            self._queue.push(tid)  # no longer waiting: may be chosen to run
        if answered:
            self._notify(self._on_early_answer, dict(self._state.early_answer or {}))
        for rec in to_stop:
            self._stop(tc, rec, fraction, trigger=(rec.trial_id == trigger_id))
        return rung.survivors

    def _previous(self, r: int) -> Optional[RungRecord]:
        return self._state.rungs[r - 1] if r > 0 else None

    def _notify(self, callback: Optional[Callable[[Dict[str, Any]], None]], payload: Dict[str, Any]) -> None:
        notify(callback, json_safe(payload), self._strict)

    def progress(self) -> list[dict[str, Any]]:
        """Per rung: reached, alive, stopped, finished (``SchedulerState.progress``)."""
        return self._state.progress()

    def _stop(self, tc: Optional["TuneController"], rec: TrialRecord, fraction: float, trigger: bool) -> None:
        """Mark stopped; a trial other than the one reporting is stopped through the controller
        (a RUNNING one gets STOP on its next result)."""
        self._state.stop(rec, fraction)
        if trigger or tc is None:
            return
        trial = self._queue.find(rec.trial_id, tc)
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

    # ------------------------------------------------------------------ when the early answer is given

    def _compose_early_answer(self) -> bool:
        """Make the early answer from the last rung if there is none yet; True if made now."""
        if self._state.early_answer is None:
            self._state.early_answer = self._early_answer()
            return self._state.early_answer is not None
        return False

    def _early_answer(self) -> Optional[dict[str, Any]]:
        """The early answer from the last rung as it stands (``hpo.decisions.early_answer``)."""
        r, trials = len(self._rungs) - 1, self._state.trials
        return compose_early_answer(
            self._state.rungs[r], trials, margin_text=self.margin_text(r),
            predictor=self._judge.predictor, decision_mode=self._decision_mode,
            compute_fraction=self.compute_fraction(), decided_at=utc_now(), metric=str(self._metric))

    def _announce_early_answer(self) -> None:
        """Write the state holding the new early answer, then hand it to ``on_early_answer``."""
        self._persist(force=True)
        self._notify(self._on_early_answer, dict(self._state.early_answer or {}))

    def _revise_early_answer(self, why: str) -> None:
        """The last rung changed after its answer was announced: when the answer made now names
        another trial, announce it again with ``revised`` (``hpo.decisions.early_answer.revise``)."""
        old = self._state.early_answer
        new = None if old is None else revise(old, self._early_answer(), why, utc_now())
        if new is not None:
            self._state.early_answer = new
            logger.warning("CollapseScheduler: early answer revised: trial %s replaces %s (%s)",
                           new["trial_id"], old.get("trial_id"), why)
            self._announce_early_answer()

    def _maybe_async_early_answer(self) -> None:
        """Async: the early answer once every live trial has been judged at the last rung."""
        last, trials = self._state.rungs[-1], self._state.trials
        if (self._decision_mode == "async" and self._state.early_answer is None and last.entries
                and not any(self._state.live(rec) and tid not in last.entries for tid, rec in trials.items())):
            last.decided_at = last.decided_at or utc_now()
            if self._compose_early_answer():
                self._announce_early_answer()

    # ------------------------------------------------------------------ Tune hooks

    def _guard(self, fn: Callable[..., Any], default: Any, *args: Any) -> Any:
        return guarded(fn, default, self._strict, *args)  # a hook never raises into Tune's loop

    def on_trial_add(self, tune_controller: "TuneController", trial: Trial) -> None:
        """Register a trial. Idempotent: restores and retries call it again for known trials."""
        self._guard(self._on_add, None, trial)

    def _on_add(self, trial: Trial) -> None:
        self._queue.add(trial)
        rec, may_block = self._state.add_trial(trial.trial_id, dict(getattr(trial, "config", None) or {}),
                                               _RAY_TO_STATUS.get(getattr(trial, "status", Trial.PENDING)))
        if may_block:
            self._walk.add(rec)
            self._walk.reopen(rec)
        self._persist()

    def on_trial_result(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> str:
        """CONTINUE, PAUSE (sync: waiting at an undecided rung) or STOP."""
        return self._guard(self._on_result, TrialScheduler.CONTINUE, tune_controller, trial, result)

    def _ingest(self, rec: TrialRecord, result: Mapping[str, Any]) -> bool:
        """Take a result (``ReportReader.read`` checks it against the contract) into the
        trial's history; returns True when the trial diverged (non-finite metric or ``diverged``)."""
        t, value = self._reader.read(rec, result, self._metric)
        if value is None:
            self._state.diverge(rec, t)
            logger.info("CollapseScheduler: trial %s diverged at t̂=%g", rec.trial_id, t)
            return True
        rewound, dropped = self._state.take_point(rec, t, value)
        if rewound and self._decision_mode == "sync" and t < self._rungs[0] - T_HAT_EPS:
            self._reader.warn_restart(rec.trial_id, t)
        if dropped:
            self._walk.reopen(rec)
        self._store.append(rec.trial_id, t, value)
        return False

    def _on_result(self, tc: "TuneController", trial: Trial, result: Dict) -> str:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            raise SchedulerContractError(
                f"CollapseScheduler: result for trial {trial.trial_id}, which was never added "
                "(on_trial_add); this scheduler instance is not the one the trial was registered with")
        if rec.out:
            return TrialScheduler.STOP  # stopped earlier (also across a restore)
        if not rec.alive:
            self._walk.reopen(rec)  # alive again (a trial reporting after an error)
        rec.status = TrialStatus.RUNNING
        if self._ingest(rec, result):
            self._try_decide(tc)
            self._maybe_async_early_answer()
            self._persist(force=True)
            return TrialScheduler.STOP
        if self._state.between_rungs(rec):
            self._persist()
            return TrialScheduler.CONTINUE
        if not self._enter_rungs(tc, rec, trigger=True):
            self._try_decide(tc, trigger_id=rec.trial_id)  # a rung decision persists itself
        self._maybe_async_early_answer()
        # Async judgements of single arrivals are persisted throttled: a lost one is made again
        # when the restored trial reaches the rung.
        self._persist()
        if rec.status == TrialStatus.STOPPED:
            return TrialScheduler.STOP
        # Never pause a trial that is finishing: it would run its last step twice.
        if self._decision_mode == "sync" and self._state.waiting_rung(rec.trial_id) is not None \
                and not result.get("done") and rec.last_train_fraction < 1.0 - T_HAT_EPS:
            rec.status = TrialStatus.PAUSED
            self._queue.push(rec.trial_id)
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> None:
        """A RUNNING trial finished or was stopped (by us, a stopper or the user)."""
        self._guard(self._on_complete, None, tune_controller, trial, result)

    def _on_complete(self, tc: "TuneController", trial: Trial, result: Optional[Dict]) -> None:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None:
            raise SchedulerContractError(f"CollapseScheduler: trial {trial.trial_id} completed but was never added")
        if self._deciding or rec.out:
            return  # stopped by us: persisted with the decision
        if not (result and self._ingest(rec, result)):
            self._state.complete(rec)
            self._enter_rungs(tc, rec, trigger=False)
        self._try_decide(tc)
        self._maybe_async_early_answer()
        # Throttled, except for the sweep's last trial: the report reads the state when it ends.
        # (Newest first: the trials still alive are mostly the last added, so the check does not
        # walk every finished trial at each completion, quadratic over a 10,000-trial sweep.)
        self._persist(force=not any(r.alive for r in reversed(self._state.trials.values())))

    def on_trial_error(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A trial failed. Its absence must not block a rung; a retry re-adds it."""
        self._guard(self._on_gone, None, tune_controller, trial, TrialStatus.ERROR)
        self._queue.push(trial.trial_id)  # Ray may requeue it PENDING

    def on_trial_remove(self, tune_controller: "TuneController", trial: Trial) -> None:
        """A PAUSED or PENDING trial was stopped (by us via ``stop_trial``, or by Tune/user)."""
        self._guard(self._on_gone, None, tune_controller, trial, TrialStatus.STOPPED)

    def _on_gone(self, tc: "TuneController", trial: Trial, status: TrialStatus) -> None:
        rec = self._state.trials.get(trial.trial_id)
        if rec is None or self._deciding or rec.out or rec.status == TrialStatus.COMPLETED:
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
            for trial in (t for t in trials if t.status in (Trial.PENDING, Trial.PAUSED)):
                if not self._state.may_run(trial.trial_id, sync=False):
                    self._guard(self._terminate, None, tune_controller, trial)
        self._queue.index(trials)
        chosen = self._queue.first(Trial.PENDING, self._may_run) or self._queue.first(Trial.PAUSED, self._may_run)
        if chosen is not None and chosen.status == Trial.PAUSED:
            self._queue.push(chosen.trial_id)  # Ray stages it PENDING and may ask again
        if self._strict:  # tests: the queue must pick what a walk over the controller's list picks
            assert chosen is first_by_walk(trials, self._may_run), "choose_trial_to_run queue"
        return chosen

    def _may_run(self, trial: Trial) -> bool:
        return self._state.may_run(trial.trial_id, sync=self._decision_mode == "sync")

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
        """The keep-margin rung ``r`` was decided with, in words."""
        return self._judge.margin_text(self._state.rungs[r], short)

    def debug_string(self) -> str:
        """One header line, then a line per rung (``SchedulerState.debug_string``)."""
        self._state.settings = self._settings()
        return self._state.debug_string()
