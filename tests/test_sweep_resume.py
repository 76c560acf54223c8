"""Killing a sweep's driver mid-run and resuming loses no finished trial and no decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from sweep_fixtures import tiny_sweep


def _state(output: Path) -> dict:
    path = output / "scheduler_state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_kill_driver_after_first_rung_then_resume(tmp_path: Path) -> None:
    # The first rung's decisions survive a SIGKILL of the driver; resume finishes the sweep
    # with the same survivors, the stopped trials stay stopped, and one trial completes.
    output = tmp_path / "out"
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(tiny_sweep(output)))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "hpo.cli", "sweep", str(config_path)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            rungs = _state(output).get("rungs", [])
            if rungs and rungs[0]["decided"]:
                break
            assert driver.poll() is None, "sweep ended before its first rung was decided"
            time.sleep(0.5)
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

    resumed = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "resume", str(output)], env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _state(output)
    assert after["rungs"][0]["survivors"] == first_survivors
    assert after["rungs"][1]["decided"] and after["rungs"][1]["survivors"][0] in first_survivors
    for trial_id in stopped_before:
        assert after["trials"][trial_id]["status"] == "stopped"
        assert after["trials"][trial_id]["stopped_at"] == 0.2
    statuses = sorted(t["status"] for t in after["trials"].values())
    assert statuses == ["completed", "stopped", "stopped", "stopped"]
    assert (output / "predicted_best.json").exists()
