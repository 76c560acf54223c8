"""`hpo monitor --job` / `--follow` and the alarms `hpo status` shows, on a real local MLflow
store (SQLite) written the way a sweep writes it: a parent run tagged with the Ray Job id, one
child run per trial with its params, `loss` and `train_fraction` histories, the residual metric
and the alarm tags of hpo.monitor.live. Only the Ray Jobs API is stood in for (its job metadata)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from mlflow.entities import Metric, Param

from hpo.monitor.live import ALARM_TAG, RESIDUAL_METRIC
from tests.test_monitor import BAND, PRED, T, clean, drift

JOB = "raysubmit_test26"
PARAMS = {"tau": "0.2", "tokens_per_param": "20.0", "n_params": "100000", "schedule": "linear",
          "warmup_fraction": "0.1"}


class FakeSweep:
    """A sweep's MLflow runs, grown point by point as its trials train."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        from hpo.tracking.runs import JOB_TAG

        self.uri, self.client = uri, MlflowClient(tracking_uri=uri)
        self.experiment = self.client.create_experiment("sweep-exp")
        self.parent = self.client.create_run(self.experiment, run_name="sweep", tags={JOB_TAG: JOB})
        self.losses = {"trial_clean": clean(800), "trial_drift": drift(clean(801), 0.4, 0.05)}
        self.runs, self.logged = {}, 0
        for trial in self.losses:
            run = self.client.create_run(self.experiment, run_name=trial, tags={
                "mlflow.parentRunId": self.parent.info.run_id, "trial_id": trial})
            self.client.log_batch(run.info.run_id, params=[
                Param(k, v) for k, v in PARAMS.items()])
            self.runs[trial] = run.info.run_id

    def grow(self, until: float) -> None:
        """Log every point up to t̂ = ``until``."""
        end = int(np.searchsorted(T, until, side="right"))
        for trial, run_id in self.runs.items():
            metrics = [m for k in range(self.logged, end) for m in (
                Metric("loss", float(self.losses[trial][k]), 1000 + k, k),
                Metric("train_fraction", float(T[k]), 1000 + k, k))]
            for i in range(0, len(metrics), 900):
                self.client.log_batch(run_id, metrics=metrics[i:i + 900])
        self.logged = end

    def end(self) -> None:
        for run_id in [*self.runs.values(), self.parent.info.run_id]:
            self.client.set_terminated(run_id)


class FakeJobs:
    """The Ray Jobs API's answer for JOB: the metadata hpo submit wrote."""

    def __init__(self, sweep: FakeSweep) -> None:
        self.meta = {"collapse_hpo": "sweep", "sweep": "quickstart", "experiment": "sweep-exp",
                     "tracking_uri": sweep.uri, "output_dir": "/storage/out"}

    def get_job_info(self, job_id: str):
        if job_id != JOB:
            raise RuntimeError(f"Job {job_id} does not exist")
        return SimpleNamespace(metadata=self.meta, status="RUNNING", message=None)


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    import hpo.tracking.cluster

    store = FakeSweep(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(hpo.tracking.cluster, "connect", lambda address: hpo.tracking.cluster.Cluster(FakeJobs(store), "http://head:8265"))
    return store


@pytest.fixture
def predictor(tmp_path):
    return dataclasses.replace(PRED, monitor=BAND).save(tmp_path / "p.json")


def test_monitor_job_reads_only_that_sweeps_trials(sweep, predictor, capsys):
    from hpo.service.cli import main

    other = sweep.client.create_run(sweep.experiment, run_name="not-a-trial")  # same experiment, another sweep
    sweep.client.log_batch(other.info.run_id, metrics=[Metric("loss", 3.0, 1, 1)])
    sweep.grow(1.0)
    assert main(["monitor", "--job", JOB, "--predictor", str(predictor), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert set(rows) == set(sweep.runs.values())
    assert rows[sweep.runs["trial_clean"]]["alarm"] is False
    drifted = rows[sweep.runs["trial_drift"]]
    assert drifted["alarm"] is True and 0.4 < drifted["first_alarm_train_fraction"] < 1.0
    # An unknown job: one line naming it, exit 2.
    assert main(["monitor", "--job", "raysubmit_nope", "--predictor", str(predictor)]) == 2
    err = capsys.readouterr().err
    assert "raysubmit_nope" in err and len(err.strip().splitlines()) == 1


def test_follow_prints_only_changes_until_the_runs_end(sweep, predictor):
    from hpo.monitor.command import CurveSource, follow
    from predictors import Predictor

    stages = iter([0.2, 0.35, 0.7, 1.0])  # the drift starts at 0.4: ok at 0.35
    sweep.grow(next(stages))
    said: list[str] = []

    def sleep(_: float) -> None:  # the sweep trains on while `--follow` waits
        nxt = next(stages, None)
        if nxt is None:
            sweep.end()
        else:
            sweep.grow(nxt)

    rows = follow(CurveSource(job=JOB), Predictor.load(predictor), None, every=0.0, say=said.append, sleep=sleep)
    clean_id, drift_id = sweep.runs["trial_clean"], sweep.runs["trial_drift"]
    clean_lines = [s for s in said if s.startswith(clean_id)]
    drift_lines = [s for s in said if s.startswith(drift_id)]
    # Each run: aligning, then ok, once each (not repeated at every read); the drift then its ALARM once.
    assert [s.split()[1] for s in clean_lines] == ["aligning", "ok"]
    assert [s.split()[1] for s in drift_lines] == ["aligning", "ok", "ALARM"]
    assert said[-1] == "all runs ended: 1 alarm(s) in 2 run(s)"
    assert rows[drift_id]["alarm"] and not rows[clean_id]["alarm"]


def test_follow_on_the_cli_for_a_finished_file_prints_once_and_ends(tmp_path, predictor, capsys):
    import pandas as pd

    from hpo.service.cli import main
    from tests.test_monitor import _curve_rows

    path = tmp_path / "curves.csv"
    pd.DataFrame(_curve_rows("a", T, clean(810)) + _curve_rows("b", T, drift(clean(811), 0.4, 0.05))).to_csv(path)
    assert main(["monitor", str(path), "--predictor", str(predictor), "--follow", "--every", "0.01"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("a  ok") and "ALARM" in lines[1]
    assert lines[2] == "all runs ended: 1 alarm(s) in 2 run(s)"
    for argv, words in ((["--follow", "--json"], "--follow"), (["--every", "0"], "--every")):
        assert main(["monitor", str(path), "--predictor", str(predictor), *argv]) == 2
        assert words in capsys.readouterr().err


def test_status_shows_each_trials_alarm(sweep):
    from mlflow.entities import RunTag

    from hpo.tracking.cluster import connect
    from hpo.service.jobs import format_state, job_state

    sweep.grow(1.0)
    assert "monitor: no alarm (2 trial(s), 0 past their alignment window)" in format_state(
        job_state(connect(None), JOB, None))
    drift_id = sweep.runs["trial_drift"]
    for trial, r in (("trial_clean", 0.001), ("trial_drift", 0.046)):
        sweep.client.log_batch(sweep.runs[trial], metrics=[Metric(RESIDUAL_METRIC, r, 5000, 499)])
    sweep.client.log_batch(drift_id, tags=[RunTag(ALARM_TAG, "0.7120"), RunTag(f"{ALARM_TAG}_direction", "above")])
    state = job_state(connect(None), JOB, None)
    (alarm,) = state["monitor"]["alarms"]
    assert alarm["trial_id"] == "trial_drift" and alarm["at"] == pytest.approx(0.712)
    assert state["monitor"]["trials"] == 2 and json.dumps(state)  # --json prints it
    text = format_state(state)
    assert "monitor: 1 of 2 trial(s) in ALARM" in text
    assert "trial_drift: loss above its collapse band since t̂ = 0.712, residual now +4.60%" in text


def test_follow_an_experiment_ends_when_its_runs_have_ended(sweep, predictor):
    from hpo.monitor.command import CurveSource, follow
    from predictors import Predictor

    sweep.grow(1.0)
    source = CurveSource(experiment=sweep.experiment, tracking_uri=sweep.uri)
    said: list[str] = []
    follow(source, Predictor.load(predictor), None, every=0.0, say=said.append, max_polls=2)
    assert said[-1] == "stopped following: 1 alarm(s) in 2 run(s)"  # still RUNNING after two reads
    assert len(said) == 3  # one line per run, not repeated at the second read
    sweep.end()
    said.clear()
    follow(source, Predictor.load(predictor), None, every=0.0, say=said.append)
    assert said[-1] == "all runs ended: 1 alarm(s) in 2 run(s)" and len(said) == 3
