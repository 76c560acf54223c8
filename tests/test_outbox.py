"""MLflow writes a sweep could not deliver wait in the sweep folder and are sent once
(``hpo/tracking/outbox.py``). The server's absence is a client whose every request fails as
MLflow's does when nothing listens (a ``requests`` ConnectionError); the store behind it is a real
SQLite one. A real ``mlflow server`` stopped and restarted under a sweep is
``benchmarks/reliability.py``'s "Cluster faults" section (and the slow test at the end)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from hpo.tracking.outbox import PENDING_FILE
from hpo.tracking.runs import MlflowResultLog, SweepTracker
from sweep_fixtures import tiny_sweep


class Switchable:
    """A real client, cut off from its store while ``down`` (as a stopped server is)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.down, self.requests_while_down = client, False, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.requests_while_down += 1
                raise requests.exceptions.ConnectionError("Connection refused")
            return method(*args, **kwargs)
        return call


def _tracker(tmp_path: Path) -> tuple[SweepTracker, Switchable]:
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e", tmp_path / "out", "sweep")
    tracker.start({"a": 1})
    server = Switchable(tracker.client.client)
    tracker.client.client = server
    return tracker, server


def _history(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))


def test_writes_wait_in_the_sweep_folder_while_the_server_is_away_and_arrive_once(tmp_path: Path) -> None:
    tracker, server = _tracker(tmp_path)
    log = MlflowResultLog(tracker)
    log("t1", {"step": 0, "loss": 3.0})
    server.down = True
    began = time.perf_counter()
    log("t1", {"step": 1, "loss": 2.5})           # the write that finds the server gone
    log("t2", {"step": 0, "loss": 2.9})           # a trial that starts meanwhile: its run is queued
    tracker.publish_progress([{"fraction": 0.2}], 0.3, rungs_decided=1)
    tracker.close_child("t1", "completed")
    assert time.perf_counter() - began < 2 and server.requests_while_down == 1  # no request after the first
    pending = tmp_path / "out" / PENDING_FILE
    assert len(pending.read_text().splitlines()) == 7  # 2 trials × (log), 1 run made, progress (text + tags), close (tag + status)
    saved = pending.read_text()

    server.down = False
    assert tracker.upload_pending() == 0 and not pending.exists()
    # Sent again (a kill during the first replay, or a response lost with the server): no copies.
    pending.write_text(saved)
    assert SweepTracker(tracker.tracking_uri, "e", tmp_path / "out", "sweep").upload_pending() == 0

    client = MlflowClient(tracker.tracking_uri)
    runs = client.search_runs([tracker.experiment_id()])
    children = {r.data.tags["trial_id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(runs) == 3 and sorted(children) == ["t1", "t2"]
    assert _history(client, children["t1"].info.run_id) == [(0, 3.0), (1, 2.5)]
    assert _history(client, children["t2"].info.run_id) == [(0, 2.9)]
    assert children["t1"].info.status == "FINISHED" and children["t1"].data.tags["status"] == "completed"
    assert client.get_run(tracker.parent_run_id()).data.tags["collapse_hpo.rungs_decided"] == "1"
    assert client.get_run(tracker.parent_run_id()).info.status == "RUNNING"
    # The queued trial's placeholder was replaced by its real run in mlflow_runs.json.
    assert tracker._ids["trials"]["t2"] == children["t2"].info.run_id


def test_a_queue_replayed_in_part_keeps_the_rest_for_hpo_report(tmp_path: Path) -> None:
    # The server answers again, then goes away during the replay: what was sent is gone from the
    # file, the rest stays, named by the real run ids, for a later process to send.
    tracker, server = _tracker(tmp_path)
    server.down = True
    child = tracker.reopen_child("t1", "lr=1")
    now = int(time.time() * 1000)
    for step in range(4):
        tracker.client.log_batch(child, metrics=[Metric("loss", 3.0 - step / 10, now, step)])
    server.down = False
    real_log_batch, calls = server.client.log_batch, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 2:
            server.down = True
        return real_log_batch(*args, **kwargs)
    server.client.log_batch = flaky
    assert tracker.upload_pending() > 0
    left = (tmp_path / "out" / PENDING_FILE).read_text()
    assert "pending:" not in left
    server.down = False
    server.client.log_batch = real_log_batch
    later = SweepTracker(tracker.tracking_uri, "e", tmp_path / "out", "sweep")
    assert later.upload_pending() == 0
    client = MlflowClient(tracker.tracking_uri)
    assert [s for s, _ in _history(client, later._ids["trials"]["t1"])] == [0, 1, 2, 3]


def test_a_request_the_server_refuses_is_not_queued(tmp_path: Path) -> None:
    # Only an unreachable server defers a write: a bad request still fails where it is made.
    tracker, _ = _tracker(tmp_path)
    with pytest.raises(Exception, match="(?i)run"):
        tracker.client.set_tag("0" * 32, "k", "v")
    assert not (tmp_path / "out" / PENDING_FILE).exists()


def test_hpo_report_sends_what_waited(tmp_path: Path) -> None:
    # `hpo report DIR` of a sweep folder whose pending file is left: sent to the sweep's store.
    from hpo.service.sweep import upload_pending

    tracker, server = _tracker(tmp_path)
    server.down = True
    tracker.tag_parent({"late": "yes"})
    out = tmp_path / "out"
    config = {**tiny_sweep(out), "name": "sweep", "mlflow": {"experiment": "e", "tracking_uri": tracker.tracking_uri}}
    (out / "sweep.yaml").write_text(yaml.safe_dump(config))
    line = upload_pending(out)
    assert line and "1 records" in line and not (out / PENDING_FILE).exists()
    assert MlflowClient(tracker.tracking_uri).get_run(tracker.parent_run_id()).data.tags["late"] == "yes"


@pytest.mark.slow
def test_a_real_server_stopped_and_restarted_gets_every_write_once(tmp_path: Path) -> None:
    # `mlflow server` stopped under a tracker and started again on the same store and port (the
    # sweep-level case, with Ray and the trials, is benchmarks/reliability.py's "Cluster faults").
    from cluster_fixtures import MlflowServer

    server = MlflowServer(tmp_path / "server").start()
    try:
        tracker = SweepTracker(server.uri, "e", tmp_path / "out", "sweep")
        tracker.start({"a": 1})
        log = MlflowResultLog(tracker)
        log("t1", {"step": 0, "loss": 3.0})
        server.stop()
        began = time.perf_counter()
        log("t1", {"step": 1, "loss": 2.5})
        log("t2", {"step": 0, "loss": 2.9})
        tracker.close_child("t1", "completed")
        assert time.perf_counter() - began < 30  # MLflow alone retries for about four minutes
        server = MlflowServer(tmp_path / "server", port=server.port).start()
        assert tracker.upload_pending() == 0
        client = MlflowClient(server.uri)
        runs = client.search_runs([tracker.experiment_id()])
        children = {r.data.tags["trial_id"]: r.info.run_id for r in runs if "mlflow.parentRunId" in r.data.tags}
        assert len(runs) == 3 and _history(client, children["t1"]) == [(0, 3.0), (1, 2.5)]
        assert _history(client, children["t2"]) == [(0, 2.9)]
    finally:
        server.stop()
