"""A sweep runs on an existing Ray cluster: a head and a second node started on this machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sweep_fixtures import tiny_sweep


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive_nodes(address: str, env: dict) -> int:
    probe = ("import ray; ray.init(address=%r, log_to_driver=False); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))" % address)
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    lines = run.stdout.strip().splitlines()
    return int(lines[-1]) if run.returncode == 0 and lines and lines[-1].isdigit() else 0


def _stop(process: subprocess.Popen) -> None:
    """End one `ray start --block` and everything it started, and nothing else.

    (`ray stop` would kill every Ray cluster on the machine, a user's own included.)"""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # --block tears its node down on SIGTERM
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@pytest.fixture()
def two_node_cluster(tmp_path: Path):
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    # Ray 2.60 clusters authenticate with a token shared by every node (~/.ray/auth_token).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    subprocess.run([ray_bin, "get-auth-token", "--generate"], check=True, env=env,
                   capture_output=True, timeout=60)
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--disable-usage-stats", "--block"]
    nodes: list[subprocess.Popen] = []
    try:
        for args in (["--head", f"--port={port}", "--include-dashboard=false"], [f"--address={address}"]):
            nodes.append(subprocess.Popen(
                [ray_bin, "start", *args, "--node-ip-address=127.0.0.1", *common], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))
            want, deadline = len(nodes), time.time() + 180
            while _alive_nodes(address, env) < want:
                assert all(n.poll() is None for n in nodes), "ray start exited early"
                assert time.time() < deadline, f"the cluster did not reach {want} node(s)"
                time.sleep(2)
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)


def test_sweep_through_two_node_cluster(tmp_path: Path, two_node_cluster: str) -> None:
    # `hpo sweep --address` uses the running cluster (2 nodes × 1 CPU) and finishes the sweep.
    output = tmp_path / "out"
    config_path = tmp_path / "tiny.yaml"
    sweep = tiny_sweep(output)
    sweep["ray"] = {}
    config_path.write_text(yaml.safe_dump(sweep))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    run = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "sweep", str(config_path), "--address", two_node_cluster],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((output / "scheduler_state.json").read_text())
    assert sorted(t["status"] for t in state["trials"].values()) == ["completed", "stopped", "stopped", "stopped"]
    # Both nodes were part of the cluster the sweep ran on.
    assert _alive_nodes(two_node_cluster, env) == 2
