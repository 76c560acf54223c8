"""Which trial Ray Tune runs next under :class:`hpo.decisions.scheduler.CollapseScheduler`
(``TrialScheduler.choose_trial_to_run``): the first PENDING trial that may run, in the
controller's list order, else the first PAUSED one, found without walking the list (at
10,000 trials a walk per call made Tune's loop quadratic).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Optional, Sequence

from ray.tune.experiment import Trial


def first_by_walk(trials: Sequence[Trial], may_run: Callable[[Trial], bool]) -> Optional[Trial]:
    """The definition (tests check :class:`RunQueue` against it): the first PENDING trial that
    may run, else the first PAUSED one."""
    paused: Optional[Trial] = None
    for trial in trials:
        if trial.status == Trial.PENDING and may_run(trial):
            return trial
        if trial.status == Trial.PAUSED and paused is None and may_run(trial):
            paused = trial
    return paused


class RunQueue:
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
        that are elsewhere or may not run are dropped (they are pushed again when that changes),
        except a RUNNING trial's: Ray keeps a trial told to PAUSE running until its checkpoint
        is written and tells the scheduler nothing when it then becomes PAUSED, so a survivor
        decided meanwhile would never be pushed again (two trials reaching a rung together hung
        the sweep)."""
        heap, running, chosen = self.heaps[status], set(), None
        while heap:
            place, tid = heapq.heappop(heap)
            trial = self.trials.get(tid)
            if trial is None or self.place.get(tid) != place:
                continue
            if trial.status == status and may_run(trial):
                chosen = trial
                heapq.heappush(heap, (place, tid))
                break
            if trial.status == Trial.RUNNING:
                running.add((place, tid))
        for entry in running:
            heapq.heappush(heap, entry)
        return chosen

    def index(self, trials: Sequence[Trial]) -> None:
        """Add the controller's trials this queue was never told about (a scheduler unpickled by
        ``Tuner.restore`` is handed trials it never saw added)."""
        if len(trials) != len(self.trials):
            for trial in trials:
                if trial.trial_id not in self.trials:
                    self.add(trial)

    def find(self, trial_id: str, controller: Any) -> Optional[Trial]:
        """The Trial object Ray registered (without walking its list: one walk per loser was
        quadratic at 10,000 trials); one never registered here is looked up."""
        return self.trials.get(trial_id) or next((t for t in controller.get_trials() if t.trial_id == trial_id), None)

    def __len__(self) -> int:
        return len(self.trials)
