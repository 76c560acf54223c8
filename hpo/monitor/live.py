"""The collapse-residual monitor live in a sweep: a Ray Tune Callback and Stopper.

Every trial result extends the trial's curve (t̂, the smoothed loss or, for a predictor fitted on
it, the validation loss); once the trial is past its
alignment window, its residual r (``predictors.monitor``) is logged to the trial's MLflow run
as the step metric ``collapse_residual``. The first alarm is printed, tagged on the trial's
run (``monitor_alarm``: the t̂ it was raised at, ``monitor_alarm_direction``) and, only when the
sweep says ``monitor: {stop_on_alarm: true}``, stops the trial through the Stopper. The
scheduler's decisions are untouched: nothing here reads or writes its keep rule.

A result whose t̂ is not after the last one seen (a trial resumed from a checkpoint reports
again from there) is a restart: the curve is cut back to before it and the point is marked,
so the monitor gives it its restart grace.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ray import tune

from predictors import Controls, Predictor
from predictors.monitor import MonitorResult, monitor_curve
from predictors.run_keys import METRIC_COLUMNS

RESIDUAL_METRIC = "collapse_residual"
ALARM_TAG = "monitor_alarm"


@dataclass
class _TrialCurve:
    t_hat: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    controls: Optional[Controls] = None
    result: Optional[MonitorResult] = None
    alarm_announced: bool = False


class TrialMonitor:
    """Per-trial curves and monitor verdicts (no Ray: the Callback and Stopper share one)."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor
        self.band = predictor.monitor_band
        # The curve the predictor was fitted on (the sweep refuses one fitted on another metric
        # than its scheduler.metric): the smoothed training loss, or the validation loss.
        self.column = METRIC_COLUMNS.get(predictor.metric, "smoothed_loss")
        self.trials: dict[str, _TrialCurve] = {}

    def update(self, trial_id: str, result: dict) -> Optional[MonitorResult]:
        """Add one Tune result (keys ``train_fraction``, ``smoothed_loss`` (or ``val_loss`` for a
        predictor fitted on it) and the controls the trainable reports) and return the trial's verdict (None before it has one)."""
        state = self.trials.setdefault(trial_id, _TrialCurve())
        t = result.get("train_fraction")
        y = result.get(self.column)
        if not (isinstance(t, (int, float)) and isinstance(y, (int, float))) or not (math.isfinite(t) and math.isfinite(y)) or y <= 0:
            return state.result  # a diverged point: the scheduler's divergence rule handles it
        if state.t_hat and t <= state.t_hat[-1]:
            if t == state.t_hat[-1] and y == state.loss[-1]:
                return state.result  # the same result seen twice (Stopper and Callback)
            keep = sum(1 for x in state.t_hat if x < t)
            del state.t_hat[keep:], state.loss[keep:]
            state.restarts.append(float(t))
        state.t_hat.append(float(t))
        state.loss.append(float(y))
        if state.controls is None:
            try:
                state.controls = Controls.from_mapping(result)
            except (KeyError, ValueError):
                return None
        try:
            state.result = monitor_curve(state.t_hat, state.loss, self.predictor, state.controls,
                                         band=self.band, restarts=state.restarts)
        except ValueError:
            state.result = None
        return state.result

    def new_alarm(self, trial_id: str) -> Optional[MonitorResult]:
        """The trial's result the first time it is in alarm (None otherwise, and afterwards)."""
        state = self.trials.get(trial_id)
        if state is None or state.result is None or not state.result.alarm or state.alarm_announced:
            return None
        state.alarm_announced = True
        return state.result

    def alarmed(self, trial_id: str) -> bool:
        state = self.trials.get(trial_id)
        return bool(state and state.result is not None and state.result.alarm)


class MonitorStopper(tune.Stopper):
    """Stops a trial in alarm when ``stop_on_alarm``; never stops the whole sweep."""

    def __init__(self, monitor: TrialMonitor, stop_on_alarm: bool = False) -> None:
        self.monitor = monitor
        self.stop_on_alarm = stop_on_alarm

    def __call__(self, trial_id: str, result: dict) -> bool:
        self.monitor.update(trial_id, result)
        return self.stop_on_alarm and self.monitor.alarmed(trial_id)

    def stop_all(self) -> bool:
        return False


class MonitorCallback(tune.Callback):
    """Logs each trial's residual to its MLflow run; prints and tags its first alarm.

    Args:
        monitor: the shared :class:`TrialMonitor`.
        tracker: the sweep's ``hpo.tracking.runs.SweepTracker`` (None: print only).
        say: where alarm lines go (default ``print``).
        stop_on_alarm: said in the alarm line.
    """

    def __init__(self, monitor: TrialMonitor, tracker: Any = None, say: Callable[[str], None] = print,
                 stop_on_alarm: bool = False) -> None:
        self.monitor = monitor
        self.tracker = tracker
        self.say = say
        self.stop_on_alarm = stop_on_alarm

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        verdict = self.monitor.update(trial.trial_id, result)
        if verdict is None or verdict.status == "aligning":
            return
        run_id = None
        if self.tracker is not None:
            from mlflow.entities import Metric

            run_id = self.tracker.reopen_child(trial.trial_id, str(trial))
            step = int(result.get("step", result.get("training_iteration", 0)))
            r = float(verdict.residual[-1])
            if math.isfinite(r):
                self.tracker.client.log_batch(run_id, metrics=[
                    Metric(RESIDUAL_METRIC, r, int(time.time() * 1000), step)])
        alarm = self.monitor.new_alarm(trial.trial_id)
        if alarm is None:
            return
        self.say(f"monitor: trial {trial.trial_id} ALARM at t̂ = {alarm.first_alarm:.3f}: its collapse residual is "
                 f"{alarm.direction} its band since t̂ = {alarm.exceed_since:.3f} "
                 f"({'stopping it' if self.stop_on_alarm else 'not stopped: monitor.stop_on_alarm is false'})")
        if self.tracker is not None and run_id is not None:
            from mlflow.entities import RunTag

            self.tracker.client.log_batch(run_id, tags=[
                RunTag(ALARM_TAG, f"{alarm.first_alarm:.4f}"),
                RunTag(f"{ALARM_TAG}_direction", str(alarm.direction))])


def trial_alarms(client: Any, parent_run: Any) -> dict[str, Any]:
    """The monitor's verdicts on a sweep's trials, as the sweep tagged them on its child runs
    (:class:`MonitorCallback`): ``{"trials": n, "alarms": [{"trial_id", "run_id", "run_name",
    "at", "direction", "last_residual"}], "last_residual": {trial_id: r}}`` (alarms by t̂).

    Read from MLflow alone (``hpo status`` has no access to the sweep's process).
    """
    from hpo.tracking.runs import filter_value

    parent_id = parent_run.info.run_id
    children = client.search_runs([parent_run.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = {filter_value(parent_id, 'run id')}",
                                  max_results=5000)
    alarms, last = [], {}
    for child in children:
        tags, trial_id = child.data.tags, child.data.tags.get("trial_id", child.info.run_id)
        r = child.data.metrics.get(RESIDUAL_METRIC)
        if r is not None:
            last[trial_id] = float(r)
        if ALARM_TAG not in tags:
            continue
        try:
            at: Optional[float] = float(tags[ALARM_TAG])
        except ValueError:
            at = None  # a tag someone else wrote: still an alarm, its time unknown
        alarms.append({"trial_id": trial_id, "run_id": child.info.run_id,
                       "run_name": tags.get("mlflow.runName", ""), "at": at,
                       "direction": tags.get(f"{ALARM_TAG}_direction"), "last_residual": last.get(trial_id)})
    alarms.sort(key=lambda a: (a["at"] is None, a["at"] or 0.0, a["trial_id"]))
    return {"trials": len(children), "alarms": alarms, "last_residual": last}


def format_alarms(monitor: Optional[dict[str, Any]]) -> list[str]:
    """``hpo status`` lines for :func:`trial_alarms`'s answer."""
    if not monitor or not monitor["trials"]:
        return []
    alarms = monitor["alarms"]
    if not alarms:
        judged = len(monitor["last_residual"])
        return [f"  monitor: no alarm ({monitor['trials']} trial(s), {judged} past their alignment window)"]
    lines = [f"  monitor: {len(alarms)} of {monitor['trials']} trial(s) in ALARM"]
    for a in alarms:
        when = f"t̂ = {a['at']:.3f}" if a["at"] is not None else "t̂ unknown"
        r = f", residual now {100 * a['last_residual']:+.2f}%" if a["last_residual"] is not None else ""
        lines.append(f"    {a['trial_id']}: loss {a['direction'] or '?'} its collapse band since {when}{r}")
    return lines
