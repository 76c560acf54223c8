"""MLflow records of a sweep: one parent run, one nested child run per trial.

Logging happens on the Ray driver (a Tune ``Callback``), not inside the trial processes.
Reasons: a single writer is what a SQLite store wants (concurrent trial processes writing
one SQLite file hit lock errors), the driver is the only process that knows the scheduler's
verdict (``stopped_at_<fraction>``, ``diverged``), and it works unchanged on a multi-node
cluster where trial processes could not reach a local database. The tracking URI is made
absolute (Ray changes each trial's working directory, which breaks relative URIs, ray
#36257) and is also exported as ``MLFLOW_TRACKING_URI`` to trial processes for users'
own trainables.

One :class:`SweepTracker` per driver run owns every run id. Ids are persisted in
``<output>/mlflow_runs.json`` (atomically, right after each run is created) and, because a
driver can die between creating a run and saving its id, each child run also carries its
``trial_id`` tag under the parent: before creating a child run the tracker looks for one, so
``hpo resume`` never duplicates a run. On resume the parent is set RUNNING again, runs of
trials that had finished but were left RUNNING by a killed driver are closed with their
verdict, and any exception marks the parent (and the runs still open) FAILED
(:meth:`SweepTracker.running`).

Published state. The moment the scheduler decides a rung or announces the early answer, the
tracker publishes it on the parent run (:meth:`SweepTracker.publish_decision`,
:meth:`SweepTracker.publish_early_answer`): short tags for a glance in the MLflow UI and the
whole record as a JSON artifact under ``collapse_hpo/``. A sweep submitted as a Ray Job tags
its parent run with the job id (:data:`JOB_TAG`), so ``hpo status`` / ``hpo answer`` on any
machine find it with the MLflow URI alone (:func:`find_job_run`, :func:`read_published`), no
shared filesystem needed.

The tracker keeps only a URI without credentials (``hpo.tracking.uri.use_credentials`` moved
them into MLflow's own environment variables), so nothing it writes or pickles holds a
password.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ray import tune

from hpo.common.errors import InputError
from hpo.decisions.early_answer import config_words, early_answer_text, order_line
from hpo.decisions.scheduler_records import TERMINAL_STATUSES, TrialStatus
from hpo.tracking.outbox import PENDING_FILE, OutboxClient, is_placeholder, unreachable
from hpo.tracking.uri import sqlite_path, strip_credentials
from predictors import run_keys
from predictors.io import atomic_write_json, dumps

# Result keys logged as step metrics, and the params logged once per trial.
STEP_METRICS = ("loss", "train_loss", "val_loss", "lr", "train_fraction", "predicted_final_loss")
TRIAL_PARAMS = run_keys.names(param=True)  # the table: predictors.run_keys
IDS_FILE = "mlflow_runs.json"
#: Parent-run tag holding the Ray Job id of a sweep submitted with ``hpo submit``.
JOB_TAG = "collapse_hpo.job_id"
#: Parent-run tags and artifacts of the published state (see the module docstring).
PROGRESS_TAG = "collapse_hpo.progress"
RUNGS_DECIDED_TAG = "collapse_hpo.rungs_decided"
EARLY_ANSWER_TAG = "collapse_hpo.early_answer"
STOP_TAG = "collapse_hpo.stopped"
PUBLISHED_DIR = "collapse_hpo"
EARLY_ANSWER_ARTIFACT = f"{PUBLISHED_DIR}/early_answer.json"
PROGRESS_ARTIFACT = f"{PUBLISHED_DIR}/progress.json"
#: The experiment tag MLflow 3's UI reads to tell model training from GenAI work: a sweep is
#: model training. (MLflow 3.17's UI, with its GenAI / Model training switch, goes by the URL
#: instead: ``hpo.tracking.uri.experiment_page`` is the link every message prints.)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: The run description the MLflow UI shows on a run's page and in its runs table.
NOTE_TAG = "mlflow.note.content"
#: Parent-run metrics: what the sweep answered, at a glance in the runs table.
COMPUTE_METRIC = "compute_used"
PICK_PREDICTED_METRIC = "pick_predicted_final_loss"
PICK_FINAL_METRIC = "pick_final_loss"
P_BEST_METRIC = "pick_probability_best"


#: The ids this package puts into MLflow search filters (Ray job, trial and MLflow run ids).
#: MLflow's filter grammar has no escape for a quote, so a value is checked, never escaped.
_FILTER_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,255}")


def filter_value(value: Any, field: str) -> str:
    """``value`` quoted for an MLflow filter string, if it is a plain id; an
    :class:`~hpo.common.errors.InputError` naming ``field`` otherwise (a quote would splice the rest
    of it into the filter, and could select another job's runs).

    >>> filter_value("raysubmit_8Gk2", "JOB")
    "'raysubmit_8Gk2'"
    """
    text = str(value)
    if not _FILTER_VALUE.fullmatch(text):
        raise InputError(f"{field}: {text[:80]!r} is not a valid id (letters, digits and _ . : @ + -, "
                         "starting with a letter or digit, at most 256 characters)")
    return f"'{text}'"


def decision_artifact(rung: int) -> str:
    """The artifact path of the published decision at rung index ``rung``."""
    return f"{PUBLISHED_DIR}/rung_{rung}.json"
#: Scheduler statuses of a trial that will not train again.
FINISHED_STATUSES = TERMINAL_STATUSES


def absolute_tracking_uri(uri: str) -> str:
    """Make ``sqlite:///relative.db`` and plain paths absolute; leave servers alone."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if "://" not in uri:
        return Path(uri).resolve().as_uri()
    return uri


def relocate_sqlite_store(uri: str, old_root: Path, new_root: Path) -> int:
    """Re-point the artifact locations of a SQLite store that moved with its sweep folder.

    MLflow stores absolute artifact URIs (``file:///<old output>/mlartifacts/...``) in the
    database; after a sweep folder is copied or moved, its runs would keep logging artifacts
    into the old folder. Rewrites those under ``old_root`` to ``new_root`` in the
    ``experiments`` and ``runs`` tables; returns how many rows changed. Other stores are left
    alone (a server's artifacts do not live in the sweep folder).
    """
    path = sqlite_path(uri) if uri.startswith("sqlite:") else None
    if path is None or not path.exists() or old_root == new_root:
        return 0
    old, new = old_root.as_uri(), new_root.as_uri()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        changed = 0
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            cursor = db.execute(
                f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - fixed names
                f"WHERE {column} = ? OR {column} LIKE ? ESCAPE '\\'",
                (new, len(old) + 1, old, old.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"),
            )
            changed += cursor.rowcount
    return changed


class SweepTracker:
    """Owns the parent run and the trial → child-run mapping (persisted to JSON)."""

    def __init__(self, tracking_uri: str, experiment: str, output_dir: Path, sweep_name: str,
                 artifact_location: Optional[str] = None) -> None:
        self.tracking_uri = strip_credentials(absolute_tracking_uri(tracking_uri))
        # Where a newly created experiment stores artifacts. MLflow's default is ./mlruns
        # relative to the working directory, which would scatter artifacts; with the default
        # SQLite store we keep them beside it in the output directory.
        self.artifact_location = artifact_location
        self.experiment = experiment
        self.output_dir = Path(output_dir)
        self.sweep_name = sweep_name
        self._client: Any = None
        self._ids_path = self.output_dir / IDS_FILE
        self._ids: dict[str, Any] = {"parent": None, "trials": {}}
        self._experiment_id: Optional[str] = None
        self._reopened: set[str] = set()  # child runs set RUNNING again in this driver run
        self._created: set[str] = set()  # child runs created by this driver run (no history before it)
        self._unread_history: set[str] = set()  # runs whose history the server was away to give

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # clients hold connections; rebuilt lazily after unpickling
        return state

    @property
    def client(self) -> OutboxClient:
        """The sweep's MLflow client: writes the server cannot take wait in the sweep folder
        (``hpo.tracking.outbox``) and the sweep goes on."""
        if self._client is None:
            import os

            from mlflow.tracking import MlflowClient

            # Fail fast when the server is away (MLflow's default retries a request for about
            # four minutes, the sweep's driver stalled meanwhile): the write is queued instead.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
            self._client = OutboxClient(MlflowClient(tracking_uri=self.tracking_uri), self.output_dir / PENDING_FILE,
                                        self.tracking_uri, self._create_queued_child)
            if self._ids_path.exists():
                self._ids = json.loads(self._ids_path.read_text())
        return self._client

    def upload_pending(self) -> int:
        """Send the writes waiting in the sweep folder now (``hpo report``, the sweep's start and
        end); returns how many are still waiting (0: none, or all sent)."""
        client = self.client
        client.replay(force=True)
        return len(client.queued)

    def _save_ids(self) -> None:
        atomic_write_json(self._ids_path, self._ids, indent=1)

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            existing = self.client.get_experiment_by_name(self.experiment)
            if existing is None:
                self._experiment_id = self.client.create_experiment(
                    self.experiment, artifact_location=self.artifact_location,
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            else:
                self._experiment_id = existing.experiment_id
                if EXPERIMENT_KIND_TAG not in (existing.tags or {}):  # made before, or by someone else
                    self.client.set_experiment_tag(self._experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return self._experiment_id

    # ------------------------------------------------------------------ parent

    def parent_run_id(self, params: Optional[dict[str, Any]] = None) -> str:
        """The sweep's parent run, created on first use and reused on resume."""
        client = self.client
        if self._ids.get("parent") is None:
            run = client.create_run(self.experiment_id(), run_name=self.sweep_name,
                                    tags={"collapse_hpo.kind": "sweep"})
            self._ids["parent"] = run.info.run_id
            self._save_ids()
            for key, value in (params or {}).items():
                client.log_param(run.info.run_id, key, _param_value(value))
        return self._ids["parent"]

    def start(self, params: Optional[dict[str, Any]] = None) -> str:
        """Create the parent run, or (resume) set the existing one RUNNING again."""
        client = self.client  # first use loads the saved ids
        existed = self._ids.get("parent") is not None
        parent = self.parent_run_id(params)
        if existed and client.get_run(parent).info.status != "RUNNING":
            client.update_run(parent, status="RUNNING")
        return parent

    @contextlib.contextmanager
    def running(self, params: Optional[dict[str, Any]] = None) -> Iterator[str]:
        """``with tracker.running(): ...`` — the parent is RUNNING inside; any exception
        (Ctrl-C included) marks it and every child run still RUNNING FAILED, then re-raises.
        A normal exit leaves closing to :meth:`finish_parent`."""
        parent = self.start(params)
        try:
            yield parent
        except BaseException:
            with contextlib.suppress(Exception):  # the original error matters more
                self.close_open_children("FAILED")
                self.finish_parent("FAILED")
            raise

    def tag_parent(self, tags: dict[str, Any]) -> None:
        """Set ``tags`` on the parent run in one request (non-strings as JSON)."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.parent_run_id(), tags=[RunTag(k, _param_value(v)) for k, v in tags.items()])

    def log_parent_artifacts(self, paths: list[Path]) -> None:
        parent = self.parent_run_id()
        for path in paths:
            if path.is_dir():
                self.client.log_artifacts(parent, str(path), artifact_path=path.name)
            elif path.exists():
                self.client.log_artifact(parent, str(path))

    # ------------------------------------------------------------------ published state

    def publish_decision(self, decision: dict[str, Any]) -> None:
        """A rung decision (``CollapseScheduler(on_decision=...)``'s payload) on the parent run:
        the decision as ``collapse_hpo/rung_<i>.json``, the progress it carries as tags and as
        ``collapse_hpo/progress.json``."""
        parent = self.parent_run_id()
        rung = int(decision["rung"])
        self.client.log_text(parent, dumps(decision, indent=1), decision_artifact(rung))
        self.publish_progress(decision.get("progress") or [], decision.get("compute_fraction"),
                              rungs_decided=rung + 1)

    def publish_progress(self, progress: list[dict[str, Any]], compute_fraction: Optional[float],
                         rungs_decided: Optional[int] = None) -> None:
        """Per-rung trial counts (``CollapseScheduler.progress``) and the compute used so far
        (the tag is cut at MLflow's length limit: readers then take the artifact)."""
        record = {"progress": progress, "compute_fraction": compute_fraction, "published_at": time.time()}
        self.client.log_text(self.parent_run_id(), dumps(record, indent=1), PROGRESS_ARTIFACT)
        tags: dict[str, Any] = {PROGRESS_TAG: dumps(record, indent=None)}
        if rungs_decided is not None:
            tags[RUNGS_DECIDED_TAG] = str(rungs_decided)
        self.tag_parent(tags)

    def publish_early_answer(self, answer: dict[str, Any]) -> None:
        """The early answer (the content of ``predicted_best.json``) on the parent run: the
        whole answer as ``collapse_hpo/early_answer.json``, its main fields as tags."""
        parent = self.parent_run_id()
        self.client.log_text(parent, dumps(answer, indent=1), EARLY_ANSWER_ARTIFACT)
        self.describe_sweep(answer)
        self.tag_parent({
            "predicted_best.trial_id": answer.get("trial_id"),
            "predicted_best.config": answer.get("config"),
            "predicted_best.final_loss": answer.get("predicted_final_loss"),
            "predicted_best.uncertainty": answer.get("uncertainty"),
            "predicted_best.probability_best": answer.get("probability_best"),
            "predicted_best.rung": answer.get("rung"),
            "predicted_best.compute_fraction": answer.get("compute_fraction"),
            # The same short form the terminal prints (the margin's evidence is in report.md).
            "predicted_best.order": order_line(answer) or "",
            "predicted_best.answer": early_answer_text(answer),
            "predicted_best.kept": answer.get("kept"),
            # After the artifact: its presence tells a client that the artifact is complete.
            EARLY_ANSWER_TAG: "1",
        })

    def describe_sweep(self, answer: Optional[dict[str, Any]], table_markdown: str = "",
                       compute_used: Optional[float] = None, pick_final: Optional[float] = None) -> None:
        """What the sweep answered, where the MLflow UI shows it first: the parent run's
        description (the early answer, then the report's rung table, in markdown) and its
        metrics (compute used, the pick's predicted final, P(best), and its true final once known)."""
        from mlflow.entities import Metric, RunTag

        parts = ["**Early answer**", "", "```", early_answer_text(answer), "```"] if answer else \
            ["No early answer (no rung was decided with a prediction)."]
        if table_markdown:
            parts += ["", table_markdown]
        now = int(time.time() * 1000)
        values = {COMPUTE_METRIC: compute_used if compute_used is not None else (answer or {}).get("compute_fraction"),
                  PICK_PREDICTED_METRIC: (answer or {}).get("predicted_final_loss"),
                  P_BEST_METRIC: (answer or {}).get("probability_best"), PICK_FINAL_METRIC: pick_final}
        metrics = [Metric(k, float(v), now, 0) for k, v in values.items()
                   if isinstance(v, (int, float)) and math.isfinite(float(v))]
        # MLflow caps a tag value at 8,000 characters: a very long table is cut, report.md has it whole.
        self.client.log_batch(self.parent_run_id(), metrics=metrics,
                              tags=[RunTag(NOTE_TAG, "\n".join(parts)[:8000])])

    def finish_parent(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_run_id(), status=status)

    # ------------------------------------------------------------------ children

    def _find_child(self, trial_id: str) -> Optional[str]:
        """A child run of this parent already tagged with ``trial_id`` (oldest first)."""
        runs = self.client.search_runs(
            [self.experiment_id()],
            filter_string=(f"tags.trial_id = {filter_value(trial_id, 'trial id')} and "
                           f"tags.`mlflow.parentRunId` = {filter_value(self.parent_run_id(), 'parent run id')}"),
            order_by=["attributes.start_time ASC"], max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def child_run_id(self, trial_id: str, trial_name: str) -> str:
        client = self.client
        run_id = self._ids["trials"].get(trial_id)
        if run_id is None:
            entry = {"trial_id": trial_id, "experiment_id": self.experiment_id(), "run_name": trial_name,
                     "tags": {"mlflow.parentRunId": self.parent_run_id(), "trial_id": trial_id,
                              "status": str(TrialStatus.RUNNING)},
                     "start_time": int(time.time() * 1000)}
            if client.queued:  # the server is away: the run is created when the queue is sent
                run_id = client.queue_child(entry)
            else:
                try:
                    run_id = self._create_queued_child(entry, save=False)
                except Exception as exc:
                    if not unreachable(exc):
                        raise
                    client._went_away(exc)
                    run_id = client.queue_child(entry)
            self._created.add(run_id)
        if self._ids["trials"].get(trial_id) != run_id:
            self._ids["trials"][trial_id] = run_id
            self._save_ids()
        return run_id

    def _create_queued_child(self, entry: dict[str, Any], save: bool = True) -> str:
        """The run of a trial (``entry``: what :meth:`child_run_id` knew when it was first
        needed): the one already tagged with its trial id under the parent, else a new one."""
        run_id = self._find_child(entry["trial_id"])
        if run_id is None:
            run_id = self.client.client.create_run(entry["experiment_id"], start_time=entry["start_time"],
                                                   tags=entry["tags"], run_name=entry["run_name"]).info.run_id
        self._created.add(run_id)
        if save and self._ids["trials"].get(entry["trial_id"]) != run_id:
            self._ids["trials"][entry["trial_id"]] = run_id
            self._save_ids()
        return run_id

    def reopen_child(self, trial_id: str, trial_name: str) -> str:
        """The trial's child run, set RUNNING again if an earlier driver run closed it."""
        run_id = self.child_run_id(trial_id, trial_name)
        if run_id not in self._reopened:
            self._reopened.add(run_id)
            if run_id not in self._created and self._status(run_id) != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _status(self, run_id: str) -> Optional[str]:
        """A run's status; None while its creation is queued or the server is away."""
        if is_placeholder(run_id):
            return None
        try:
            return self.client.get_run(run_id).info.status
        except Exception as exc:
            if unreachable(exc):
                return None
            raise

    def history_unknown(self, run_id: str) -> bool:
        """Whether this driver could not read the run's metric history (the server was away):
        its points are then sent without those of a step already there."""
        return run_id in self._unread_history

    def last_logged_step(self, run_id: str, metric: str = "loss") -> int:
        """The highest step of ``metric`` in a child run's history (-1: none); no request for
        a run this driver created."""
        if run_id in self._created:
            return -1
        try:
            return max((m.step for m in self.client.get_metric_history(run_id, metric)), default=-1)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._unread_history.add(run_id)
            return -1

    def params_of(self, run_id: str) -> dict[str, str]:
        """The params a run has ({} while the server is away)."""
        try:
            return dict(self.client.get_run(run_id).data.params)
        except Exception as exc:
            if unreachable(exc):
                return {}
            raise

    def close_child(self, trial_id: str, verdict: str, status: str = "FINISHED") -> None:
        run_id = self.child_run_id(trial_id, trial_id)
        self.client.set_tag(run_id, "status", verdict)
        self.client.set_terminated(run_id, status=status)

    def close_finished(self, trials: dict[str, dict[str, Any]], verdict: Callable[[dict[str, Any]], str]) -> int:
        """Close the child runs a killed driver left RUNNING although their trials had
        finished (``trials``: the scheduler state's records). Returns how many were closed."""
        closed = 0
        for trial_id, run_id in list(self._ids["trials"].items()):
            record = trials.get(trial_id)
            if record is None or record.get("status") not in FINISHED_STATUSES:
                continue
            if self._status(run_id) in ("RUNNING", None):
                self.close_child(trial_id, verdict(record), "FAILED" if record.get("status") == TrialStatus.ERROR else "FINISHED")
                closed += 1
        return closed

    def close_open_children(self, status: str) -> None:
        for run_id in self._ids["trials"].values():
            if self._status(run_id) in ("RUNNING", None):
                self.client.set_terminated(run_id, status=status)


# ----------------------------------------------------------------------------- readers (clients)


def find_job_run(client: Any, experiment: str, job_id: str) -> Optional[Any]:
    """The parent run of the sweep submitted as Ray Job ``job_id`` (None if it has none yet)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{JOB_TAG}` = {filter_value(job_id, 'JOB')}",
                              order_by=["attributes.start_time ASC"], max_results=1)
    return runs[0] if runs else None


def _read_artifact(client: Any, run_id: str, path: str) -> Optional[Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, path, tmp)
        except Exception:  # noqa: BLE001 - not published (yet): MLflow raises several kinds
            return None
        return json.loads(Path(local).read_text())


def read_published(client: Any, run: Any) -> dict[str, Any]:
    """What a sweep published on its parent run ``run``: ``status`` (the run's), ``progress``
    (per-rung counts and compute, or None before the first decision), ``rungs_decided``,
    ``early_answer`` (the content of ``predicted_best.json``, or None) and ``stopped``."""
    tags = run.data.tags
    progress = None
    if PROGRESS_TAG in tags:
        try:
            progress = json.loads(tags[PROGRESS_TAG])
        except ValueError:  # cut at the tag length limit: the artifact has it whole
            progress = _read_artifact(client, run.info.run_id, PROGRESS_ARTIFACT)
    answer = _read_artifact(client, run.info.run_id, EARLY_ANSWER_ARTIFACT) if tags.get(EARLY_ANSWER_TAG) else None
    return {"run_id": run.info.run_id, "status": run.info.status, "progress": progress,
            "rungs_decided": int(tags.get(RUNGS_DECIDED_TAG, 0)), "early_answer": answer,
            "stopped": json.loads(tags[STOP_TAG]) if STOP_TAG in tags else None}


def record_stop(client: Any, parent_run_id: str, stop: dict[str, Any]) -> int:
    """``hpo stop``: the parent run and every child run still RUNNING end KILLED, and the stop
    (who, when, which job) is tagged on the parent. Returns how many runs were ended."""
    run = client.get_run(parent_run_id)
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = {filter_value(parent_run_id, 'run id')}",
                                  max_results=5000)
    client.set_tag(parent_run_id, STOP_TAG, json.dumps(stop))
    ended = 0
    for child in children:
        # Open at the stop: still RUNNING (a driver killed outright), or marked FAILED by the
        # driver's own teardown on Ray's SIGTERM while its trial still trained (its status tag
        # still "running"; a trial that really failed carries "error", a finished one its verdict).
        if child.info.status in ("RUNNING", "SCHEDULED") or (
                child.info.status == "FAILED" and child.data.tags.get("status") == TrialStatus.RUNNING):
            client.set_tag(child.info.run_id, "status", "killed")
            client.set_terminated(child.info.run_id, status="KILLED")
            ended += 1
    # The parent is KILLED whatever the dying driver wrote last (it may have marked it FAILED).
    client.set_terminated(parent_run_id, status="KILLED")
    return ended + 1


def child_run_name(trial: Any) -> str:
    """A trial's run name in the MLflow UI: its config as the sweep searched it (``lr=0.005``),
    or Ray's trial name when it has no searched values."""
    config = {k: v for k, v in (getattr(trial, "config", None) or {}).items()
              if not str(k).startswith("_") and isinstance(v, (int, float, str))}
    return config_words(config) or str(trial)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:6000]


class LiveStopper(tune.Stopper):
    """The stoppers this driver built, as Ray Tune's ``stop``. Ray pickles its stopper into the
    experiment state, and a resumed run restores that copy over the one passed to ``tune.run``
    (``TuneController.__setstate__``): the old driver's result log, holding the old folder's
    MLflow store, would then log a resumed *copy* of a sweep into the original. Pickled, this
    stopper is only a reference to the live one of whichever process unpickles it."""

    live: Optional["LiveStopper"] = None

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        LiveStopper.live = self

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(self.inner(trial_id, result))

    def stop_all(self) -> bool:
        return bool(self.inner.stop_all())

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_live_stopper, ())


def _live_stopper() -> Any:
    """What an unpickled :class:`LiveStopper` becomes: this process's live one (none: stop nothing)."""
    from ray.tune.stopper import NoopStopper

    return LiveStopper.live if LiveStopper.live is not None else NoopStopper()


class MlflowResultLog(tune.Stopper):
    """Each trial's step metrics into its MLflow run, *before* the scheduler sees the result.

    Ray Tune hands a result to the stopper first, then to the scheduler (which persists its
    decision, and the early answer, in ``scheduler_state.json``), then to the callbacks. Logged
    from a callback, a driver killed between the scheduler's write and the callback lost the
    result that decided the rung from the trial's metric history (2 of 3 kills). Logged here, a
    result the scheduler has taken is in MLflow; a result logged but not taken is trained and
    reported again after ``hpo resume`` and is then skipped by its step (as is every interval a
    trial trains twice from an older checkpoint): each step reaches the history exactly once.
    Stops nothing (it is a stopper only for where Ray calls it)."""

    def __init__(self, tracker: SweepTracker) -> None:
        self.tracker = tracker
        self.names: dict[str, str] = {}  # trial id → its run name (child_run_name), from on_trial_start
        self._last_step: dict[str, int] = {}  # trial id → highest step in its run's history
        self.logged: dict[str, int] = {}  # trial id → the step this driver logged last (for the callback)

    def __call__(self, trial_id: str, result: dict) -> bool:
        from mlflow.entities import Metric

        if result.get("replayed"):
            return False  # the last result of a trial that had finished before a resume: logged then
        step = int(result.get("step", result.get("training_iteration", 0)))
        run_id = self.tracker.reopen_child(trial_id, self.names.get(trial_id, trial_id))
        last = self._last_step.get(trial_id)
        if last is None:
            last = self._last_step[trial_id] = self.tracker.last_logged_step(run_id)
        if step <= last:
            return False  # already in the history (a step trained again after a kill)
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(result[key]), now, step) for key in STEP_METRICS
                   if isinstance(result.get(key), (int, float)) and not isinstance(result.get(key), bool)
                   and math.isfinite(float(result[key]))]
        if metrics:
            self.tracker.client.log_batch(run_id, metrics=metrics, after_history=self.tracker.history_unknown(run_id))
        self._last_step[trial_id] = step
        self.logged[trial_id] = step
        return False

    def stop_all(self) -> bool:
        return False


class MlflowSweepCallback(tune.Callback):
    """Tune callback writing each trial's params, step metrics and final status tag.

    Args:
        tracker: the sweep's :class:`SweepTracker`.
        trial_status: maps a trial id to its verdict (``completed``,
            ``stopped_at_<fraction>``, ``diverged``), normally the scheduler's view.
        predicted_final: maps a trial id to its latest predicted final loss, or None.
        metric: the sweep's ``scheduler.metric``; the ``final_loss`` logged at the end is its
            last value (the smoothed training loss, or the validation loss).
    """

    def __init__(self, tracker: SweepTracker, trial_status: Callable[[str], str],
                 predicted_final: Callable[[str], Optional[float]] = lambda _: None,
                 result_log: Optional[MlflowResultLog] = None, metric: str = "loss") -> None:
        self.tracker = tracker
        # The sweep's scheduler.metric: its curve's last point is the trial's final_loss.
        self.final_column = run_keys.METRIC_COLUMNS.get(metric, "smoothed_loss")
        self.trial_status = trial_status
        self.predicted_final = predicted_final
        # With a result log (the sweep's stopper), the reported metrics are logged there, before
        # the scheduler; this callback adds only the prediction the scheduler made from them.
        self.result_log = result_log
        self._params_logged: set[str] = set()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.result_log is not None:
            self.result_log.names[trial.trial_id] = child_run_name(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        from mlflow.entities import Metric, Param

        run_id = self.tracker.reopen_child(trial.trial_id, child_run_name(trial))
        client = self.tracker.client
        if trial.trial_id not in self._params_logged:
            params = [Param(k, _param_value(result[k])) for k in TRIAL_PARAMS if k in result]
            # The searched keys under the names the sweep YAML and the report use (``lr``, …),
            # so filtering the MLflow UI by them works; the trainer's names (``eta``) stay too.
            named = {p.key for p in params}
            params += [Param(str(k), _param_value(v)) for k, v in (trial.config or {}).items()
                       if not str(k).startswith("_") and str(k) not in named]
            # A run this driver made has none yet; a server that is away: log them all (the
            # same value logged again is no change).
            existing = {} if run_id in self.tracker._created else self.tracker.params_of(run_id)
            params = [p for p in params if p.key not in existing]
            if params:
                client.log_batch(run_id, params=params)
            self._params_logged.add(trial.trial_id)
        if result.get("replayed"):
            return  # the last result of a trial that had finished before a resume: logged then
        step = int(result.get("step", result.get("training_iteration", 0)))
        now = int(time.time() * 1000)
        values = dict(result)
        predicted = self.predicted_final(trial.trial_id)
        if predicted is not None:
            values["predicted_final_loss"] = predicted
        if self.result_log is not None:
            if self.result_log.logged.get(trial.trial_id) == step and predicted is not None:
                client.log_batch(run_id, metrics=[Metric("predicted_final_loss", float(predicted), now, step)])
            return
        metrics = []
        for key in STEP_METRICS:
            value = values.get(key)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                metrics.append(Metric(key, float(value), now, step))
        if metrics:
            client.log_batch(run_id, metrics=metrics)

    def _close(self, trial: Any, failed: bool) -> None:
        status = TrialStatus.ERROR if failed else self.trial_status(trial.trial_id)
        last = getattr(trial, "last_result", None) or {}
        final = last.get(self.final_column)
        if (status == TrialStatus.COMPLETED and isinstance(final, (int, float)) and math.isfinite(float(final))
                and float(last.get("train_fraction", 0.0)) >= 1.0 - 1e-9):
            # The one final loss (predictors.smoothing.FINAL_LOSS_DEFINITION) as its own metric.
            from mlflow.entities import Metric

            run_id = self.tracker.child_run_id(trial.trial_id, child_run_name(trial))
            self.tracker.client.log_batch(run_id, metrics=[
                Metric("final_loss", float(final), int(time.time() * 1000), int(last.get("step", 0)))])
        self.tracker.close_child(trial.trial_id, status, "FAILED" if failed else "FINISHED")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=True)
