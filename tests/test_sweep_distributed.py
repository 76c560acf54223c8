"""A sweep runs on an existing Ray cluster: a head and a second node started on this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweep_fixtures import tiny_sweep


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def two_node_cluster(tmp_path: Path):
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    # Ray 2.60 clusters authenticate with a token shared by every node (~/.ray/auth_token).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    subprocess.run([ray_bin, "get-auth-token", "--generate"], check=True, env=env,
                   capture_output=True, timeout=60)
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--disable-usage-stats"]
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                    "--include-dashboard=false", *common], check=True, env=env, capture_output=True,
                   timeout=120)
    try:
        subprocess.run([ray_bin, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
                        *common], check=True, env=env, capture_output=True, timeout=120)
        yield address
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)


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
    probe = ("import ray; ray.init(address=%r, log_to_driver=False); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))" % two_node_cluster)
    nodes = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                           timeout=120)
    assert nodes.stdout.strip().splitlines()[-1] == "2", nodes.stderr[-2000:]
