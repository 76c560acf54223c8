"""Replay banked curves through any Ray Tune scheduler in simulated time, without a Ray runtime.

:class:`SimulatedSweep` plays the part of Ray Tune's ``TuneController`` (2.60) for a
``TrialScheduler`` — ``CollapseScheduler``, Ray's ``ASHAScheduler``, ``MedianStoppingRule``,
``HyperBandScheduler`` — over curves whose every result is known in advance (a curve bank,
``hpo.trials.replay.run_points``). Trials run on ``n_workers`` slots; a trial's next result arrives
after the compute its training-fraction step costs; the scheduler's decisions are applied as
the controller applies them:

* CONTINUE: the trial reports its next result; PAUSE: it leaves its slot (PAUSED) and resumes
  at its next result when ``choose_trial_to_run`` returns it (a checkpoint is implied: nothing
  is trained twice); STOP: ``on_trial_complete`` with that result, then TERMINATED.
* The last result of a curve (``done``) never reaches ``on_trial_result``: it goes to
  ``on_trial_complete``. A result flagged ``diverged`` ends the curve there.
* ``stop_trial`` (the scheduler stopping a trial itself): PENDING/PAUSED → ``on_trial_remove``;
  RUNNING → ``on_trial_complete`` with its last result; then TERMINATED.
* When a slot is free, ``choose_trial_to_run`` is asked once; the controller also starts
  PENDING trials on its own, in creation order.

Arrival order is deterministic (time, then creation order), so asynchronous schedulers give
one answer per sweep instead of one per run. Thousands of simulated sweeps take seconds, which
is what the decision benchmark (``benchmarks/decisions.py``) needs; ``hpo.trials.replay.replay_sweep``
runs the same curves through a real Ray Tune instead (the test suite checks both agree).

Example:
    >>> from ray.tune.schedulers import ASHAScheduler
    >>> runs = {r: [{"loss": 2 + k / 10 - t / 2, "train_fraction": t} for t in (0.25, 0.5, 0.75, 1.0)]
    ...         for k, r in enumerate(["a", "b", "c", "d"])}
    >>> asha = ASHAScheduler(metric="loss", mode="min", time_attr="train_fraction", max_t=1.0,
    ...                      grace_period=0.25, reduction_factor=2)
    >>> outcome = SimulatedSweep(asha, runs, n_workers=1).run()
    >>> outcome.reached
    {'a': 1.0, 'b': 0.25, 'c': 0.25, 'd': 0.25}
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers.trial_scheduler import TrialScheduler

from predictors.curves import compute_fraction


class SimulationError(RuntimeError):
    """The scheduler left trials PAUSED/PENDING with nothing running (a deadlock)."""


@dataclass
class SimulatedOutcome:
    """What a simulated sweep did.

    Attributes:
        reached: run id → the largest t̂ the trial reported (its compute).
        completed: run ids that ran to their last result.
        decisions: (run id, t̂, decision) for every result shown to ``on_trial_result``.
        pauses: how many times a trial was paused.
        makespan: simulated time until the last trial ended (in units of one trial's t̂ = 1).
    """

    reached: dict[str, float]
    completed: list[str]
    decisions: list[tuple[str, float, str]] = field(default_factory=list)
    pauses: int = 0
    makespan: float = 0.0

    def compute_fraction(self, weights: Optional[Mapping[str, float]] = None) -> float:
        """The sweep's compute against training every trial to the end (``predictors.curves.compute_fraction``)."""
        return compute_fraction(self.reached, weights)


class SimulatedSweep:
    """A sweep of replayed curves under one ``TrialScheduler``, in simulated time.

    Args:
        scheduler: any Ray Tune ``TrialScheduler`` (with metric and mode set).
        runs: run id → its results in order (dicts with the metric and ``train_fraction``;
            the last one ends the run). Trials are created in this order, with
            ``config = {"run_id": id, **configs[id]}``.
        n_workers: concurrent slots (2 = two 1-CPU trials on two cores).
        configs: optional trial configs by run id.
        time_attr: the result key giving each step's cost (t̂ by default).
        costs: optional per-run cost of one unit of ``time_attr`` (default 1: equal sizes).
    """

    def __init__(
        self, scheduler: TrialScheduler, runs: Mapping[str, Sequence[Mapping[str, Any]]], *, n_workers: int = 2,
        configs: Optional[Mapping[str, Mapping[str, Any]]] = None, time_attr: str = "train_fraction",
        costs: Optional[Mapping[str, float]] = None,
    ) -> None:
        if n_workers < 1:
            raise ValueError("n_workers: must be >= 1")
        self.scheduler = scheduler
        self.runs = {str(r): [dict(p) for p in points] for r, points in runs.items()}
        if any(not points for points in self.runs.values()):
            raise ValueError("runs: every run needs at least one result")
        self.n_workers = n_workers
        self.time_attr = time_attr
        self.costs = {r: float((costs or {}).get(r, 1.0)) for r in self.runs}
        self.trials = [Trial("__fake", trial_id=r, stub=True, config={"run_id": r, **dict((configs or {}).get(r, {}))})
                       for r in self.runs]
        self._by_id = {t.trial_id: t for t in self.trials}
        self._next = {r: 0 for r in self.runs}  # index of the next result to report
        self._last: dict[str, dict[str, Any]] = {}
        self._events: list[tuple[float, int, str]] = []  # (time, creation order, run id)
        self._order = {r: i for i, r in enumerate(self.runs)}
        self._now = 0.0
        self._started: set[str] = set()
        self._pending_at = 0
        self.outcome = SimulatedOutcome({r: 0.0 for r in self.runs}, [])

    # ----------------------------------------------------------- the controller API
    def get_trials(self) -> list[Trial]:
        return self.trials

    def get_live_trials(self) -> set[Trial]:
        return {t for t in self.trials if t.status != Trial.TERMINATED}

    def stop_trial(self, trial: Trial) -> None:
        if trial.status in (Trial.ERROR, Trial.TERMINATED):
            return
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
        else:
            self.scheduler.on_trial_complete(self, trial, self._last.get(trial.trial_id, {}))
        trial.set_status(Trial.TERMINATED)

    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        if trial.status == Trial.RUNNING:
            self.outcome.pauses += 1
        trial.set_status(Trial.PAUSED)

    # ----------------------------------------------------------- the loop
    def _n_running(self) -> int:
        # Only _start makes a trial RUNNING here: the set holds every running trial (and a few
        # that were since paused or ended), so counting costs the slots, not the sweep.
        self._started = {r for r in self._started if self._by_id[r].status == Trial.RUNNING}
        return len(self._started)

    def _first_pending(self) -> Optional[Trial]:
        # Trials leave PENDING once and never return to it here: a cursor walks the list once.
        while self._pending_at < len(self.trials) and self.trials[self._pending_at].status != Trial.PENDING:
            self._pending_at += 1
        return self.trials[self._pending_at] if self._pending_at < len(self.trials) else None

    def _start(self, trial: Trial) -> None:
        trial.set_status(Trial.RUNNING)
        self._started.add(trial.trial_id)
        self._schedule(trial)

    def _schedule(self, trial: Trial) -> None:
        r = trial.trial_id
        points = self.runs[r]
        i = self._next[r]
        here = float(points[i - 1].get(self.time_attr, 0.0)) if i else 0.0
        step = max(float(points[i].get(self.time_attr, 0.0)) - here, 0.0)
        heapq.heappush(self._events, (self._now + step * self.costs[r], self._order[r], r))

    def _fill(self) -> None:
        while self._n_running() < self.n_workers:
            chosen = self.scheduler.choose_trial_to_run(self)
            if chosen is None or chosen.status not in (Trial.PENDING, Trial.PAUSED):
                chosen = self._first_pending()
            if chosen is None:
                return
            self._start(chosen)

    def _deliver(self, trial: Trial) -> None:
        r = trial.trial_id
        points = self.runs[r]
        result = dict(points[self._next[r]])
        self._next[r] += 1
        t = float(result.get("train_fraction", result.get(self.time_attr, 0.0)))
        self.outcome.reached[r] = max(self.outcome.reached[r], t)
        last = self._next[r] >= len(points) or bool(result.get("diverged"))
        if last:
            result["done"] = True
            self._last[r] = result
            self.scheduler.on_trial_complete(self, trial, result)
            trial.set_status(Trial.TERMINATED)
            if not result.get("diverged"):
                self.outcome.completed.append(r)
            return
        decision = self.scheduler.on_trial_result(self, trial, result)
        self._last[r] = result
        self.outcome.decisions.append((r, t, decision))
        if trial.status != Trial.RUNNING:  # the scheduler ended it itself (stop_trial)
            return
        if decision == TrialScheduler.PAUSE:
            self.pause_trial(trial)
        elif decision == TrialScheduler.STOP:
            self.scheduler.on_trial_complete(self, trial, result)
            trial.set_status(Trial.TERMINATED)
        else:
            self._schedule(trial)

    def run(self) -> SimulatedOutcome:
        """Run every trial to its end (or its stop) and return the outcome."""
        for trial in self.trials:
            self.scheduler.on_trial_add(self, trial)
        self._fill()
        while True:
            while self._events:
                when, _, r = heapq.heappop(self._events)
                trial = self._by_id[r]
                if trial.status != Trial.RUNNING:
                    continue  # stopped or paused while its result was on its way
                self._now = max(self._now, when)
                self._deliver(trial)
                self._fill()
            self._fill()
            if not self._events:
                break
        stuck = [t.trial_id for t in self.trials if t.status in (Trial.PAUSED, Trial.PENDING)]
        if stuck:
            raise SimulationError(f"{type(self.scheduler).__name__} left {stuck} waiting with nothing running")
        self.outcome.makespan = self._now
        return self.outcome
