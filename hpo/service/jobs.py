"""Sweeps as Ray Jobs: ``hpo submit``, ``status``, ``answer``, ``logs``, ``stop``.

A team shares one Ray cluster and one MLflow tracking server; nothing of ours runs as a server.

* ``hpo submit CONFIG`` validates the config on the client exactly as ``hpo sweep`` does
  (``load_sweep_config`` + ``hpo.service.sweep.preflight_portable``), then submits a Ray Job whose
  entrypoint is ``python -m hpo.service.cli sweep .hpo-job/sweep.yaml``. The resolved config (and a
  custom predictor file) travel in the job's ``working_dir``, which Ray uploads to the head:
  the cluster runs its installed collapse-hpo (no pip install, no internet), or the code of
  ``--working-dir`` if given. Outputs go to ``<--storage>/<job id>`` (the sweep's
  ``output_dir``, Ray's ``storage_path`` under it): put it on storage every node mounts, so
  any node can ``hpo resume`` it.
* The job id travels as ``HPO_JOB_ID`` in the job's environment; the sweep tags its MLflow
  parent run with it and publishes every rung decision and the early answer there
  (``hpo.tracking.runs``). ``status`` / ``answer`` therefore need only the Ray address and the
  MLflow URI; the tracking URI a job was submitted with is also kept in its Ray metadata.
* ``hpo stop`` stops the job through Ray, then ends its MLflow runs KILLED with the stop
  tagged on the parent (``hpo.tracking.runs.record_stop``): a killed driver cannot do it itself.

Unreachable services are named within seconds (``hpo.tracking.cluster``); Ray's and
MLflow's own clients would wait or retry for minutes.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from hpo.common.errors import InputError
from hpo.tracking.cluster import Cluster, connect, job_info, tracking_client
from hpo.tracking.uri import experiment_page, strip_credentials

#: Folder inside the job's working_dir holding the submitted config (and predictor).
JOB_FILES = ".hpo-job"
#: Ray job metadata key marking the jobs ``hpo submit`` made.
METADATA_KEY = "collapse_hpo"
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
#: ``hpo answer`` exit statuses (2 stays "bad input / unreachable", as everywhere).
ANSWERED, ENDED_WITHOUT_ANSWER, STILL_RUNNING = 0, 1, 3
#: Never shipped with --working-dir: version control, caches, sweep outputs.
IGNORED_IN_WORKING_DIR = (".git", "__pycache__", "*.pyc", "runs", "mlruns", "mlartifacts", "*.egg-info",
                          ".pytest_cache", JOB_FILES)


# ----------------------------------------------------------------------------- submit


@dataclass
class Submission:
    job_id: str
    experiment: str
    experiment_id: Optional[str]
    tracking_uri: str
    output_dir: str
    dashboard: str

    def links(self) -> dict[str, str]:
        mlflow_ui = self.tracking_uri if self.tracking_uri.startswith(("http://", "https://")) else None
        return {"ray_dashboard": f"{self.dashboard}/#/jobs/{self.job_id}",
                "mlflow_ui": (experiment_page(mlflow_ui, self.experiment_id) if mlflow_ui
                              else f"mlflow ui --backend-store-uri {self.tracking_uri}")}


def _storage(storage: Optional[str]) -> str:
    storage = storage or os.environ.get("HPO_STORAGE")
    if not storage:
        raise InputError("--storage: give the directory on the cluster's shared storage the sweep writes to "
                         "(or set HPO_STORAGE)")
    if not storage.startswith("/"):
        # The sweep's output_dir is a directory (state file, SQLite store, report), so a URI
        # (s3://...) is no place for it: a shared mount is.
        raise InputError(f"--storage: {storage}: give an absolute path on storage every node mounts, as the "
                         "nodes see it (e.g. /shared/sweeps)")
    return storage.rstrip("/")


def _job_files(config: Any, output_dir: str, tracking_uri: str, working_dir: Optional[str], root: Path) -> None:
    """Lay out the job's working_dir in ``root``: a copy of ``working_dir`` (if any) plus
    ``.hpo-job/sweep.yaml`` (the validated config, pointed at the cluster's output) and, for a
    custom predictor, ``.hpo-job/predictor.json``."""
    if working_dir:
        shutil.copytree(working_dir, root, ignore=shutil.ignore_patterns(*IGNORED_IN_WORKING_DIR),
                        dirs_exist_ok=True)
    files = root / JOB_FILES
    files.mkdir(parents=True, exist_ok=True)
    resolved = config.model_dump(mode="json")
    resolved["output_dir"] = output_dir
    resolved["mlflow"]["tracking_uri"] = strip_credentials(tracking_uri)
    if config.predictor:  # a file of the client's: it travels with the job
        shutil.copyfile(config.predictor_path(), files / "predictor.json")
        resolved["predictor"] = f"{JOB_FILES}/predictor.json"
    (files / "sweep.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))


def submit(config_arg: str, overrides: tuple[str, ...], *, address: Optional[str], tracking_uri: Optional[str],
           storage: Optional[str], working_dir: Optional[str] = None) -> Submission:
    """Validate on the client, then submit the sweep as a Ray Job (see the module docstring)."""
    from hpo.data import sweep_config_path
    from hpo.service.sweep import JOB_ID_ENV, preflight_portable
    from hpo.trials.sweep_config import load_sweep_config

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise InputError("--tracking-uri: give the MLflow tracking server the cluster logs to "
                         "(or set MLFLOW_TRACKING_URI)")
    if working_dir and not Path(working_dir).is_dir():
        raise InputError(f"--working-dir: {working_dir}: not a directory")
    out_root = _storage(storage)
    # Exactly the validation of `hpo sweep`, before anything reaches the cluster.
    config = load_sweep_config(sweep_config_path(config_arg),
                               overrides=(*overrides, f"mlflow.tracking_uri={uri}"))
    preflight_portable(config)
    cluster = connect(address)
    job_id = f"hpo-{config.name}-{uuid.uuid4().hex[:8]}"
    output_dir = f"{out_root}/{job_id}"
    mlflow_client = tracking_client(uri)
    experiment = mlflow_client.get_experiment_by_name(config.mlflow.experiment)
    experiment_id = (experiment.experiment_id if experiment is not None
                     else mlflow_client.create_experiment(config.mlflow.experiment))
    shown_uri = strip_credentials(uri)
    with tempfile.TemporaryDirectory(prefix="hpo-job-") as tmp:
        _job_files(config, output_dir, uri, working_dir, Path(tmp))
        cluster.client.submit_job(
            entrypoint=f"python -m hpo.service.cli sweep {JOB_FILES}/sweep.yaml",
            submission_id=job_id,
            runtime_env={"working_dir": tmp, "env_vars": {JOB_ID_ENV: job_id}},
            metadata={METADATA_KEY: "sweep", "sweep": config.name, "experiment": config.mlflow.experiment,
                      "tracking_uri": shown_uri, "output_dir": output_dir},
        )
    return Submission(job_id, config.mlflow.experiment, experiment_id, shown_uri, output_dir, cluster.url)


# ----------------------------------------------------------------------------- read state


def last_error_line(logs: str) -> Optional[str]:
    """The line of a failed job's log that says why: our CLI's ``error: ...`` line, else the
    last line of a traceback, else the last non-empty line."""
    lines = [line.strip() for line in logs.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line
    return lines[-1] if lines else None


def job_state(cluster: Cluster, job_id: str, tracking_uri: Optional[str]) -> dict[str, Any]:
    """One job as ``status`` shows it: Ray's state, the error line of a failed job, and what
    the sweep published on MLflow (progress per rung, compute used, the early answer)."""
    from hpo.monitor.live import trial_alarms
    from hpo.tracking.runs import find_job_run, read_published

    info = job_info(cluster, job_id)
    meta = info.metadata or {}
    state: dict[str, Any] = {"job_id": job_id, "state": str(getattr(info.status, "value", info.status)),
                             "sweep": meta.get("sweep"), "experiment": meta.get("experiment"),
                             "output_dir": meta.get("output_dir"), "error": None, "published": None,
                             "monitor": None}
    if state["state"] == "FAILED":
        try:
            state["error"] = last_error_line(cluster.client.get_job_logs(job_id)) or info.message
        except Exception:  # noqa: BLE001 - the logs may be gone with their node; Ray's message stays
            state["error"] = info.message
    if meta.get("experiment"):
        mlflow_client = tracking_client(tracking_uri, meta.get("tracking_uri"))
        run = find_job_run(mlflow_client, meta["experiment"], job_id)
        if run is not None:
            state["published"] = read_published(mlflow_client, run)
            state["monitor"] = trial_alarms(mlflow_client, run)
    return state


def list_jobs(cluster: Cluster) -> list[Any]:
    """The Ray jobs ``hpo submit`` made, oldest first."""
    jobs = [j for j in cluster.client.list_jobs() if (j.metadata or {}).get(METADATA_KEY) and j.submission_id]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def format_state(state: dict[str, Any]) -> str:
    """``status`` lines of one job."""
    from hpo.decisions.early_answer import format_early_answer
    from hpo.monitor.live import format_alarms

    lines = [f"{state['job_id']}: {state['state']} (sweep {state['sweep']}, outputs {state['output_dir']})"]
    if state.get("error"):
        lines.append(f"  error: {state['error']}")
    published = state.get("published")
    if published is None:
        lines.append("  MLflow: no parent run yet")
        return "\n".join(lines)
    lines.append(f"  MLflow run {published['run_id']} ({published['status']})")
    progress = published.get("progress")
    if progress:
        for rung in progress["progress"]:
            mark = "decided" if rung["decided"] else "waiting"
            lines.append(f"  rung t̂ = {rung['fraction']:g} ({mark}): {rung['reached']} reached, {rung['alive']} alive, "
                         f"{rung['stopped']} stopped, {rung['finished']} finished")
        if progress.get("compute_fraction") is not None:
            lines.append(f"  compute used: {100 * float(progress['compute_fraction']):.1f}% of the full sweep")
    else:
        lines.append("  no rung decided yet")
    lines += format_alarms(state.get("monitor"))
    if published.get("stopped"):
        stop = published["stopped"]
        lines.append(f"  stopped by {stop.get('by')} at {stop.get('at')}")
    if published.get("early_answer"):
        from rich.text import Text

        lines.append(Text.from_markup(format_early_answer(published["early_answer"])).plain.strip("\n"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- answer, logs, stop


def answer(job_id: str, *, address: Optional[str], tracking_uri: Optional[str], wait: bool,
           timeout_s: Optional[float] = None, poll_s: float = 2.0,
           on_wait: Callable[[dict[str, Any]], None] = lambda _: None) -> tuple[int, dict[str, Any]]:
    """``(exit status, state)``: :data:`ANSWERED` once the early answer is published,
    :data:`ENDED_WITHOUT_ANSWER` if the job ended without one, :data:`STILL_RUNNING` when not
    waiting (or past ``timeout_s``) and there is none yet."""
    cluster = connect(address)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        state = job_state(cluster, job_id, tracking_uri)
        published = state.get("published") or {}
        if published.get("early_answer"):
            return ANSWERED, state
        if state["state"] in TERMINAL_STATES:
            return ENDED_WITHOUT_ANSWER, state
        if not wait or (deadline is not None and time.monotonic() >= deadline):
            return STILL_RUNNING, state
        on_wait(state)
        time.sleep(poll_s)


def logs(job_id: str, *, address: Optional[str], follow: bool, write: Callable[[str], None]) -> None:
    cluster = connect(address)
    job_info(cluster, job_id)
    if not follow:
        write(cluster.client.get_job_logs(job_id))
        return

    async def tail() -> None:
        async for chunk in cluster.client.tail_job_logs(job_id):
            write(chunk)

    asyncio.run(tail())


def stop(job_id: str, *, address: Optional[str], tracking_uri: Optional[str],
         wait_s: float = 60.0) -> dict[str, Any]:
    """Stop a running job and end its MLflow runs KILLED with the stop recorded. Returns
    ``{"job_id", "state", "already_ended", "runs_killed"}``."""
    from hpo.tracking.runs import find_job_run, record_stop

    cluster = connect(address)
    info = job_info(cluster, job_id)
    status = str(getattr(info.status, "value", info.status))
    if status in TERMINAL_STATES:
        return {"job_id": job_id, "state": status, "already_ended": True, "runs_killed": 0}
    cluster.client.stop_job(job_id)
    deadline = time.monotonic() + wait_s
    while status not in TERMINAL_STATES and time.monotonic() < deadline:
        time.sleep(0.5)
        now = cluster.client.get_job_status(job_id)
        status = str(getattr(now, "value", now))
    meta = info.metadata or {}
    killed = 0
    if meta.get("experiment"):
        mlflow_client = tracking_client(tracking_uri, meta.get("tracking_uri"))
        run = find_job_run(mlflow_client, meta["experiment"], job_id)
        if run is not None:
            record = {"job_id": job_id, "by": f"{getpass.getuser()}@{socket.gethostname()}",
                      "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "job_state": status}
            killed = record_stop(mlflow_client, run.info.run_id, record)
    return {"job_id": job_id, "state": status, "already_ended": False, "runs_killed": killed}
