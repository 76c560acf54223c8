"""Faults a team meets on a cluster, for ``benchmarks/reliability.py``'s "Cluster faults" section:

1. **the MLflow tracking server stopped for 60 s mid-sweep, then restarted** (:func:`server_outage`);
2. **a Ray worker node killed under a submitted job** (:func:`worker_node_kill`);
3. **the driver killed while it writes the scheduler state** (:func:`kill_state_writer`, SIGKILL of a
   process writing ``scheduler_state.json`` and its history log in a loop; and the real sweep driver
   SIGKILLed the moment a state write is under way, then resumed: :data:`WRITING_STATE`).

Each reports what was lost (must be nothing): runs, metric points and tags missing or doubled in
MLflow, decisions that differ from the uninterrupted run, work trained twice past a checkpoint,
a state file that does not parse or mixes two versions.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

#: The kill point of ``reliability_runs.kill_and_resume`` that fires while a state write is under way.
WRITING_STATE = "while it writes the scheduler state"


# ----------------------------------------------------------------------------- 3. kill while writing


def _state_version(i: int, n_trials: int) -> Any:
    """Version ``i`` of a scheduler state of ``n_trials`` trials: every trial's config and the
    settings carry ``i``, so a file mixing two versions shows as a mismatch."""
    from hpo.decisions.scheduler_state import RungRecord, SchedulerState, TrialRecord

    trials = {f"t{k}": TrialRecord(trial_id=f"t{k}", order=k, config={"lr": 1e-3 * (k + 1), "version": i},
                                   status="running", last_train_fraction=0.01 * (i % 100))
              for k in range(n_trials)}
    return SchedulerState(settings={"rungs": [0.5], "decision_mode": "sync", "version": i}, trials=trials,
                          rungs=[RungRecord(index=0, fraction=0.5)], experiment_id="kill-test")


def _write_forever(path: Path, start: int, n_trials: int) -> None:
    """The child: from version ``start`` on, one history point and one forced snapshot per version,
    as the scheduler's StateStore writes them (history flushed first), until it is killed."""
    from hpo.decisions.scheduler_state import StateStore

    store = StateStore(path, interval_s=0.0)
    store.started = start > 0  # a resumed writer appends to the history log
    i = start
    while True:
        store.append(f"t{i % n_trials}", 0.001 * (i + 1), float(i))
        store.save(_state_version(i, n_trials), force=True, strict=True)
        i += 1


def kill_state_writer(folder: Path, rounds: int, n_trials: int = 300, seed: int = 0,
                      max_delay_s: float = 0.08) -> dict[str, Any]:
    """``rounds`` times: fork a process that writes the state in a loop (continuing the version on
    disk), SIGKILL it after a random delay, then read what is on disk. Counts the kills that landed
    during a snapshot write (its temporary file left behind), states that failed to parse, states
    that mix versions, and history points lost (every version up to the one on disk has its point:
    the log is written before each snapshot)."""
    from hpo.decisions.scheduler_state import SchedulerState, StateStore

    rng = random.Random(seed)
    path = Path(folder) / "scheduler_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = {"kills": 0, "mid_write": 0, "unreadable": 0, "mixed": 0, "went_back": 0, "points_lost": 0,
              "versions_written": 0}
    errors: list[str] = []
    on_disk = -1
    for _ in range(rounds):
        start = on_disk + 1
        pid = os.fork()
        if pid == 0:  # the writer: never returns into the test runner
            try:
                _write_forever(path, start, n_trials)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, max_delay_s))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        counts["kills"] += 1
        left = list(path.parent.glob(f".{path.name}.*.tmp"))
        counts["mid_write"] += bool(left)
        if not path.exists():
            continue  # killed before the first snapshot
        try:
            state = SchedulerState.load(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable state is the result being measured
            counts["unreadable"] += 1
            errors.append(str(exc)[:200])
            continue
        version = state.settings.get("version")
        if any(rec.config.get("version") != version for rec in state.trials.values()) or len(state.trials) != n_trials:
            counts["mixed"] += 1
            continue
        if version < on_disk:
            counts["went_back"] += 1
        on_disk = max(on_disk, version)
        points = {int(value) for rec in state.trials.values() for _, value in rec.history}
        counts["points_lost"] = len(set(range(version + 1)) - points)
        StateStore(path, interval_s=0.0).load(state.settings, "kill-test")  # as a resumed driver does
    counts["versions_written"] = on_disk + 1
    counts["tmp_left_after_resume"] = len(list(path.parent.glob(f".{path.name}.*.tmp")))
    return {**counts, "errors": errors[:3], "rounds": rounds, "n_trials": n_trials}
