"""Killing a sweep's driver mid-run and resuming a *copy* of its folder: no finished trial or
decision lost, nothing written into the original, no duplicate MLflow run, no trial trained
again from step 0, and no run left RUNNING."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from hpo.trials.trainable import read_progress
from sweep_fixtures import tiny_sweep

REPO = Path(__file__).resolve().parents[1]


def _state(output: Path) -> dict:
    path = output / "scheduler_state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _runs(output: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-test")
    return [(run, [m.step for m in client.get_metric_history(run.info.run_id, "loss")])
            for run in client.search_runs([experiment.experiment_id])]


def test_kill_driver_after_first_rung_then_resume_a_copy(tmp_path: Path) -> None:
    output = tmp_path / "out"
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(tiny_sweep(output)))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen(
        [sys.executable, "-m", "hpo.service.cli", "sweep", str(config_path)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            rungs = _state(output).get("rungs", [])
            if rungs and rungs[0]["decided"]:
                break
            assert driver.poll() is None, "sweep ended before its first rung was decided"
            time.sleep(0.2)
        else:
            raise AssertionError("first rung not decided in time")
    finally:
        # Kill the driver and everything it started (its local Ray cluster included).
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    before = _state(output)
    first_survivors = before["rungs"][0]["survivors"]
    stopped_before = {tid for tid, t in before["trials"].items() if t["status"] == "stopped"}
    assert len(first_survivors) == 2 and len(stopped_before) == 2
    assert any(run.info.status == "RUNNING" for run, _ in _runs(output))  # the kill left them open

    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(output, copy)
    # The newest complete checkpoint of each trial at the kill: the survivors that waited at
    # the rung were paused with one; the trial whose arrival decided the rung continued
    # without (a save and restore saved) and goes back to its newest periodic one.
    checkpointed: dict[str, int] = {}
    for progress_file in (copy / "ray").rglob("progress.json"):
        progress = read_progress(progress_file.parent)
        if progress is not None:
            tid = progress["trial_id"]
            checkpointed[tid] = max(checkpointed.get(tid, 0), int(progress["step"]))
    original = _digests(output)
    resumed = subprocess.run(
        [sys.executable, "-m", "hpo.service.cli", "resume", str(copy)], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _digests(output) == original, "resuming the copy wrote into the original"

    after = _state(copy)
    assert after["rungs"][0]["survivors"] == first_survivors
    assert after["rungs"][1]["decided"] and after["rungs"][1]["survivors"][0] in first_survivors
    for trial_id in stopped_before:
        assert after["trials"][trial_id]["status"] == "stopped"
        assert after["trials"][trial_id]["stopped_at"] == 0.2
    statuses = sorted(t["status"] for t in after["trials"].values())
    assert statuses == ["completed", "stopped", "stopped", "stopped"]
    assert (copy / "predicted_best.json").exists()

    runs = _runs(copy)
    parents = [run for run, _ in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [(run, steps) for run, steps in runs if "mlflow.parentRunId" in run.data.tags]
    assert len(parents) == 1 and len(children) == 4  # one run per trial, none duplicated
    assert {run.info.status for run, _ in runs} == {"FINISHED"}
    assert sorted(run.data.tags["status"] for run, _ in children) == [
        "completed", "stopped_at_0.2", "stopped_at_0.2", "stopped_at_0.4"]
    for run, steps in children:
        # Every trial continued from its newest complete checkpoint: no step up to it was
        # trained (logged) twice; survivors paused at the rung trained nothing twice.
        newest = checkpointed.get(run.data.tags["trial_id"], 0)
        repeated = {s for s in steps if steps.count(s) > 1}
        assert all(s > newest for s in repeated), (run.info.run_name, newest, sorted(repeated))
    paused_survivors = [t for t in first_survivors if checkpointed.get(t, 0) > 0]
    assert paused_survivors, "no survivor had a pause checkpoint at the rung"
    for run, steps in children:
        if run.data.tags["trial_id"] in paused_survivors:
            assert len(steps) == len(set(steps)), run.info.run_name
    assert parents[0].info.artifact_uri.startswith(copy.as_uri())
