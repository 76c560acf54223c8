"""MLflow writes a sweep could not deliver: kept in the sweep folder, replayed once the server is back.

A team's tracking server restarts (an upgrade, a crashed pod) while sweeps run. MLflow's client
would retry each request for about four minutes and then raise, stalling and then killing the
sweep. :class:`OutboxClient` stands between the sweep's :class:`~hpo.tracking.runs.SweepTracker`
and its ``MlflowClient``: a write that fails because the server cannot be reached (connection
refused or reset, a timeout, HTTP 502/503/504) is appended to ``<output>/mlflow_pending.jsonl``
and the sweep goes on; every later write queues behind it, so the server receives them in the
order they were made. At most every :data:`RETRY_EVERY_S` the queue is replayed, after a quick
``/health`` probe (no request is retried for minutes while the server is away). What is still
queued when the sweep ends stays in the file; ``hpo report DIR`` uploads it.

Replaying is idempotent, so a write replayed twice (its response lost with the server, or a
replay cut short by a kill) leaves one copy: metric points are replayed with the timestamp they
were first logged with (MLflow's database store ignores an identical point), tags, params,
statuses and artifacts are set to the same values again, and a trial's run whose creation was
queued is first looked up by its ``trial_id`` tag (:meth:`SweepTracker.child_run_id` does the same)
before it is created. Until then the trial's run is named by a placeholder id
(``pending:<trial id>``), replaced in every queued write and in ``mlflow_runs.json`` once it exists.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

from predictors.io import atomic_write_text

PENDING_FILE = "mlflow_pending.jsonl"
#: How often a queue waiting for the server is tried again (seconds).
RETRY_EVERY_S = 10.0
#: Seconds the ``/health`` probe before a replay waits for an answer.
PROBE_TIMEOUT_S = 2.0
#: The prefix of a queued trial run's id until the server has created it.
PLACEHOLDER = "pending:"

_UNREACHABLE_WORDS = ("failed with exception", "failed with timeout exception", "Max retries exceeded",
                      "Connection refused", "Connection reset", "Connection aborted", "RemoteDisconnected",
                      "failed with error code 502", "failed with error code 503", "failed with error code 504")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the tracking server could not be reached (not that it refused a request)."""
    import requests

    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError,
                        TimeoutError)):
        return True
    text = str(exc)
    return type(exc).__name__ in ("MlflowException", "RestException") and any(w in text for w in _UNREACHABLE_WORDS)


def is_placeholder(run_id: Optional[str]) -> bool:
    return bool(run_id) and str(run_id).startswith(PLACEHOLDER)


def _metrics(metrics: list[Any]) -> list[list[Any]]:
    return [[m.key, m.value, m.timestamp, m.step] for m in metrics]


def _pairs(items: list[Any]) -> list[list[str]]:
    return [[i.key, i.value] for i in items]


class OutboxClient:
    """The writes of ``MlflowClient`` a sweep makes, queued in ``path`` while the server is away
    (see the module docstring); reads and anything else go to ``client`` as they are.

    Args:
        client: the real ``MlflowClient``.
        path: the queue file (``<output>/mlflow_pending.jsonl``).
        tracking_uri: the server's URI (credentials stripped), probed at ``/health`` before a replay.
        create_child: creates (or finds) the run of a queued ``create_child`` entry and returns its id
            (the tracker's, which also records it in ``mlflow_runs.json``).
    """

    def __init__(self, client: Any, path: Path, tracking_uri: str,
                 create_child: Callable[[dict[str, Any]], str], retry_every_s: float = RETRY_EVERY_S) -> None:
        self.client = client
        self.path = Path(path)
        self.tracking_uri = tracking_uri
        self.create_child = create_child
        self.retry_every_s = retry_every_s
        self.queued = self._read() if self.path.exists() else []
        self.resolved: dict[str, str] = {}  # placeholder → the run id the server gave it
        self._last_try = 0.0 if not self.queued else time.monotonic()
        self.delivered_late = 0  # writes replayed after an outage (for the sweep's closing line)
        self.outages = 0

    def __getattr__(self, name: str) -> Any:  # reads (get_run, search_runs, ...) go to the client
        return getattr(self.client, name)

    # ------------------------------------------------------------------ writes

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (),
                  after_history: bool = False) -> None:
        """``after_history``: on replay, drop the points whose step the run's history already has
        (the driver could not read that history when it logged them)."""
        self._write({"op": "log_batch", "run_id": run_id, "metrics": _metrics(list(metrics)),
                     "params": _pairs(list(params)), "tags": _pairs(list(tags)), "after_history": after_history})

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        self._write({"op": "log_batch", "run_id": run_id, "metrics": [], "params": [], "tags": [[key, str(value)]]})

    def log_param(self, run_id: str, key: str, value: Any) -> None:
        self._write({"op": "log_batch", "run_id": run_id, "metrics": [], "params": [[key, str(value)]], "tags": []})

    def set_terminated(self, run_id: str, status: str = "FINISHED", end_time: Optional[int] = None) -> None:
        self._write({"op": "set_terminated", "run_id": run_id, "status": status,
                     "end_time": end_time or int(time.time() * 1000)})

    def update_run(self, run_id: str, status: str) -> None:
        self._write({"op": "update_run", "run_id": run_id, "status": status})

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._write({"op": "log_text", "run_id": run_id, "text": text, "artifact_file": artifact_file})

    def log_artifact(self, run_id: str, local_path: str, artifact_path: Optional[str] = None) -> None:
        self._write({"op": "log_artifact", "run_id": run_id, "local_path": str(local_path),
                     "artifact_path": artifact_path})

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: Optional[str] = None) -> None:
        self._write({"op": "log_artifacts", "run_id": run_id, "local_path": str(local_dir),
                     "artifact_path": artifact_path})

    def queue_child(self, entry: dict[str, Any]) -> str:
        """Queue the creation of a trial's run (``entry``: trial_id, experiment_id, run_name, tags,
        start_time); returns its placeholder id."""
        placeholder = PLACEHOLDER + entry["trial_id"]
        self._append({"op": "create_child", "run_id": placeholder, **entry})
        return placeholder

    # ------------------------------------------------------------------ the queue

    def _write(self, entry: dict[str, Any]) -> None:
        if self.queued:
            self._append(entry)
            self.replay()
            return
        try:
            self._apply(entry, {})
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._went_away(exc)
            self._append(entry)

    def _went_away(self, exc: BaseException) -> None:
        self.outages += 1
        self._last_try = time.monotonic()
        message = (f"MLflow server at {self.tracking_uri} unreachable ({str(exc)[:160]}); the sweep goes on, "
                   f"its records wait in {self.path} and are sent when the server answers again")
        print(f"warning: {message}", flush=True)  # once per outage: the sweep's output, not its log

    def _append(self, entry: dict[str, Any]) -> None:
        self.queued.append(entry)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:  # a kill loses nothing the OS has
            handle.write(json.dumps(entry, allow_nan=False) + "\n")

    def _read(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # the last line of a write cut short by a kill: never sent, never needed
        return entries

    def reachable(self) -> bool:
        """Whether the server answers ``/health`` within :data:`PROBE_TIMEOUT_S` (any HTTP answer
        counts: a server behind authentication answers 401); other stores count as reachable."""
        if not self.tracking_uri.startswith(("http://", "https://")):
            return True
        try:
            with urllib.request.urlopen(f"{self.tracking_uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S):  # noqa: S310
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def replay(self, force: bool = False) -> bool:
        """Send the queued writes in order (at most every ``retry_every_s`` unless ``force``); True
        when none is left. Stops at the first that cannot reach the server; the file keeps the rest."""
        if not self.queued:
            return True
        now = time.monotonic()
        if not force and now - self._last_try < self.retry_every_s:
            return False
        self._last_try = now
        if not self.reachable():
            return False
        done, history_steps = 0, {}
        try:
            for entry in self.queued:
                self._apply(entry, history_steps)
                done += 1
        except Exception as exc:
            if not unreachable(exc):
                raise
        finally:
            if done:
                self.delivered_late += done
                self.queued = self.queued[done:]
                self._rewrite()
        if self.queued:
            return False
        print(f"MLflow server at {self.tracking_uri} answers again: {self.delivered_late} records sent that had "
              "waited in the sweep folder", flush=True)
        return True

    def _rewrite(self) -> None:
        # The runs created so far are named by their real ids in what stays queued: a later
        # process (``hpo report``) replays the rest without this one's placeholder map.
        for entry in self.queued:
            if entry["op"] != "create_child" and entry["run_id"] in self.resolved:
                entry["run_id"] = self.resolved[entry["run_id"]]
        if self.queued:
            atomic_write_text(self.path, "".join(json.dumps(e, allow_nan=False) + "\n" for e in self.queued))
        else:
            self.path.unlink(missing_ok=True)

    def _run_id(self, run_id: str) -> str:
        if is_placeholder(run_id):
            return self.resolved.get(run_id, run_id)
        return run_id

    def _apply(self, entry: dict[str, Any], history_steps: dict[tuple[str, str], int]) -> None:
        """Send one write (the ids of queued runs replaced by their real ones)."""
        from mlflow.entities import Metric, Param, RunTag

        op = entry["op"]
        if op == "create_child":
            self.resolved[entry["run_id"]] = self.create_child(entry)
            return
        run_id = self._run_id(entry["run_id"])
        if is_placeholder(run_id):  # its creation is queued before it: cannot happen in order
            raise RuntimeError(f"{self.path}: {op} for {run_id} before the run was created")
        client = self.client
        if op == "log_batch":
            points = entry["metrics"]
            if entry.get("after_history") and points:
                keep = []
                for key, value, timestamp, step in points:
                    if (run_id, key) not in history_steps:
                        history_steps[(run_id, key)] = max(
                            (m.step for m in client.get_metric_history(run_id, key)), default=-1)
                    if step > history_steps[(run_id, key)]:
                        keep.append([key, value, timestamp, step])
                points = keep
            metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in points]
            params = [Param(k, v) for k, v in entry["params"]]
            tags = [RunTag(k, v) for k, v in entry["tags"]]
            if metrics or params or tags:
                client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        elif op == "set_terminated":
            client.set_terminated(run_id, status=entry["status"], end_time=entry.get("end_time"))
        elif op == "update_run":
            client.update_run(run_id, status=entry["status"])
        elif op == "log_text":
            client.log_text(run_id, entry["text"], entry["artifact_file"])
        elif op == "log_artifact":
            if os.path.exists(entry["local_path"]):
                client.log_artifact(run_id, entry["local_path"], entry.get("artifact_path"))
        elif op == "log_artifacts":
            if os.path.isdir(entry["local_path"]):
                client.log_artifacts(run_id, entry["local_path"], entry.get("artifact_path"))
        else:
            raise ValueError(f"{self.path}: unknown queued write {op!r}")
