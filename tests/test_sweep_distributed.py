"""A sweep runs on an existing Ray cluster: a head and a second node started on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster_fixtures import RayCluster, service_env
from sweep_fixtures import tiny_sweep


@pytest.fixture()
def two_node_cluster():
    cluster = RayCluster(num_cpus=1)
    try:
        cluster.start()
        cluster.add_worker(num_cpus=1)
        yield cluster
    finally:
        cluster.stop()


# ~1 min on 2 cores (two Ray nodes started, then a sweep): with the slow tests in .ci/run, beside
# tests/test_jobs.py's sweep submitted to two nodes.
@pytest.mark.slow
def test_sweep_through_two_node_cluster(tmp_path: Path, two_node_cluster: RayCluster) -> None:
    # `hpo sweep --address` uses the running cluster (2 nodes × 1 CPU) and finishes the sweep.
    output = tmp_path / "out"
    config_path = tmp_path / "tiny.yaml"
    sweep = tiny_sweep(output)
    sweep["ray"] = {}
    config_path.write_text(yaml.safe_dump(sweep))
    run = subprocess.run(
        [sys.executable, "-m", "hpo.service.cli", "sweep", str(config_path), "--address", two_node_cluster.address],
        env=service_env(), capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((output / "scheduler_state.json").read_text())
    assert sorted(t["status"] for t in state["trials"].values()) == ["completed", "stopped", "stopped", "stopped"]
    # Both nodes were part of the cluster the sweep ran on.
    assert two_node_cluster.alive_nodes() == 2
