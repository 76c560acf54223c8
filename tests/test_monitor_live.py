"""The monitor live in sweeps (hpo.monitor.live): residual metric, alarm line and tag, stop_on_alarm."""

import dataclasses
from types import SimpleNamespace

import numpy as np

from hpo.monitor.live import ALARM_TAG, RESIDUAL_METRIC, MonitorCallback, MonitorStopper, TrialMonitor
from tests.test_monitor import BAND, PRED, T, clean, drift

CONTROLS = {"tau": 0.2, "tokens_per_param": 20.0, "schedule": "linear", "warmup_fraction": 0.1, "n_params": 1e5}


class FakeTracker:
    """Records what the callback sends to MLflow."""

    def __init__(self):
        self.metrics, self.tags = [], []
        self.client = SimpleNamespace(log_batch=self._log)

    def reopen_child(self, trial_id, name):
        return f"run-{trial_id}"

    def _log(self, run_id, metrics=(), tags=(), params=()):
        self.metrics += [(run_id, m.key, m.value) for m in metrics]
        self.tags += [(run_id, t.key, t.value) for t in tags]


def _feed(losses, stop_on_alarm, restart_at=None):
    monitor = TrialMonitor(dataclasses.replace(PRED, monitor=BAND))
    stopper = MonitorStopper(monitor, stop_on_alarm)
    tracker, said = FakeTracker(), []
    callback = MonitorCallback(monitor, tracker, said.append, stop_on_alarm)
    trial = SimpleNamespace(trial_id="t1")
    stopped_at = None
    points = list(zip(T, losses))
    if restart_at is not None:  # a resume re-reports from an earlier checkpoint
        i = int(np.searchsorted(T, restart_at))
        points = points[:i + 25] + points[i:]
    for k, (t, y) in enumerate(points):
        result = {**CONTROLS, "train_fraction": float(t), "smoothed_loss": float(y), "step": k}
        stop = stopper("t1", result)
        callback.on_trial_result(k, [], trial, result)
        if stop and stopped_at is None:
            stopped_at = float(t)
    return tracker, said, stopped_at, monitor


def test_clean_trial_logs_its_residual_and_never_alarms():
    tracker, said, stopped_at, _ = _feed(clean(700), stop_on_alarm=True)
    residuals = [v for _, key, v in tracker.metrics if key == RESIDUAL_METRIC]
    assert len(residuals) > 300 and max(abs(v) for v in residuals) < 0.02
    assert said == [] and tracker.tags == [] and stopped_at is None


def test_drifting_trial_is_announced_tagged_and_stopped_only_when_asked():
    losses = drift(clean(701), 0.4, 0.05)
    tracker, said, stopped_at, _ = _feed(losses, stop_on_alarm=False)
    assert len(said) == 1 and "ALARM" in said[0] and "not stopped" in said[0]
    (run, key, value), = [t for t in tracker.tags if t[1] == ALARM_TAG]
    assert run == "run-t1" and 0.4 < float(value) < 1.0 and stopped_at is None
    _, said, stopped_at, _ = _feed(losses, stop_on_alarm=True)
    alarm_at = float(said[0].split("t̂ = ")[1].split(":")[0])
    # The detector judges on a 0.025 grid of t̂: the alarm is the grid point, the stop the first
    # reported point at or after it (T's spacing is 0.002).
    assert "stopping it" in said[0] and 0 <= stopped_at - alarm_at < 0.0025


def test_a_resumed_trial_is_a_marked_restart():
    _, said, _, monitor = _feed(clean(702), stop_on_alarm=False, restart_at=0.6)
    state = monitor.trials["t1"]
    assert len(state.restarts) == 1 and abs(state.restarts[0] - 0.6) < 0.01
    assert np.all(np.diff(state.t_hat) > 0) and said == []


def test_sweep_config_monitor_option():
    import pytest

    from hpo.data import sweep_config_path
    from hpo.common.overrides import ConfigError
    from hpo.trials.sweep_config import load_sweep_config

    path = sweep_config_path("quickstart")
    config = load_sweep_config(path)
    assert config.monitor.enabled and config.monitor.stop_on_alarm is False
    assert load_sweep_config(path, overrides=("monitor.stop_on_alarm=true",)).monitor.stop_on_alarm is True
    with pytest.raises(ConfigError, match="monitor"):
        load_sweep_config(path, overrides=("monitor.stop_on_alarm=maybe",))
