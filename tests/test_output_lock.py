"""One driver per output folder (``hpo.common.output_lock``): a second ``hpo sweep`` / ``hpo resume`` /
``hpo calibrate`` into a folder in use exits 2 naming the holder, writes nothing; a killed holder
frees the folder; a start that failed leaves it sweepable."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from bad_input_cases import REPO, sweep_config
from hpo.common.output_lock import LOCK_FILE, FolderBusyError, hold_folder

HOLD = ("import sys, time\nfrom hpo.common.output_lock import hold_folder\n"
        "with hold_folder(sys.argv[1], 'hpo sweep'):\n    print('held', flush=True)\n    time.sleep(120)\n")


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """Another process holding ``tmp_path/out`` as a sweep driver would."""
    folder = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield folder, process
    process.kill()
    process.wait()


def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "hpo.service.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_second_sweep_into_a_folder_in_use_exits_2_naming_the_holder(holder, tmp_path: Path) -> None:
    folder, process = holder
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep_config(output_dir=str(folder))))
    done = _cli(["sweep", "s.yaml"], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {process.pid}" in lines[0] and socket.gethostname() in lines[0], lines
    assert "in use by hpo sweep" in lines[0]
    assert _names(folder) == {LOCK_FILE}  # the loser wrote no sweep.yaml


def test_resume_while_the_driver_runs_exits_2(holder, tmp_path: Path) -> None:
    folder, process = holder
    config = sweep_config(output_dir=str(folder), predictor=str(folder / "predictor.json"))
    (folder / "sweep.yaml").write_text(yaml.safe_dump(config))
    from hpo.data import default_predictor_path

    shutil.copy(default_predictor_path(), folder / "predictor.json")
    (folder / "ray" / config["name"]).mkdir(parents=True)
    (folder / "ray" / config["name"] / "experiment_state-x.json").write_text("{}")
    done = _cli(["resume", str(folder)], tmp_path)
    assert done.returncode == 2 and f"pid {process.pid}" in done.stderr, done.stderr


def test_second_calibrate_into_a_folder_in_use_exits_2(holder, tmp_path: Path) -> None:
    folder, process = holder
    shutil.copy(REPO / "configs/curves/example_curves.csv", tmp_path / "curves.csv")
    done = _cli(["calibrate", "--from-curves", "curves.csv", "--output-dir", str(folder),
                 "--predictor-out", "p.json"], tmp_path)
    assert done.returncode == 2 and f"pid {process.pid}" in done.stderr, done.stderr
    assert not (tmp_path / "p.json").exists() and _names(folder) == {LOCK_FILE}


def test_a_killed_holder_frees_the_folder(holder) -> None:
    folder, process = holder
    with pytest.raises(FolderBusyError):
        with hold_folder(folder, "hpo resume"):
            pass
    process.send_signal(signal.SIGKILL)
    process.wait()
    with hold_folder(folder, "hpo resume"):
        assert "hpo resume" in (folder / LOCK_FILE).read_text()


def test_a_failed_start_writes_nothing_and_a_start_that_wrote_its_config_can_start_again(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    from hpo.service import sweep
    from hpo.trials.sweep_config import load_sweep_config

    folder = tmp_path / "out"
    config = load_sweep_config(data=sweep_config(output_dir=str(folder)), source="s.yaml")

    def fail_after_config(config, output, *args, **kwargs):
        sweep.prepare_output(config)  # what a start writes before Ray has saved any state
        raise RuntimeError("the tracking store refused a write")

    def fail_at_once(*args, **kwargs):
        raise RuntimeError("Ray could not start")

    monkeypatch.setattr(sweep, "_execute", fail_at_once)
    with pytest.raises(RuntimeError):
        sweep.run_sweep(config)
    assert not folder.exists()  # created by the lock, removed again
    monkeypatch.setattr(sweep, "_execute", fail_after_config)
    with pytest.raises(RuntimeError):
        sweep.run_sweep(config)
    assert "sweep.yaml" in _names(folder)
    assert sweep.preflight_sweep(config) == folder  # not a dead end: the same sweep may start again
    other = load_sweep_config(data=sweep_config(output_dir=str(folder), num_samples=2), source="s.yaml")
    with pytest.raises(sweep.ConfigError, match="another config"):
        sweep.preflight_sweep(other)
    (folder / "scheduler_state.json").write_text("{}")  # it had started: resume it, never overwrite
    with pytest.raises(sweep.ConfigError, match="hpo resume"):
        sweep.preflight_sweep(config)


def test_lock_waits_for_nobody() -> None:
    # A refusal is immediate, not a wait on the holder.
    import tempfile

    folder = Path(tempfile.mkdtemp()) / "x"
    with hold_folder(folder, "hpo calibrate"):
        began = time.perf_counter()
        with pytest.raises(FolderBusyError, match="hpo calibrate"):
            with hold_folder(folder, "hpo sweep"):
                pass
        assert time.perf_counter() - began < 1
