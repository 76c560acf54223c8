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

The tracker keeps only a URI without credentials (``hpo.tracking_uri.use_credentials`` moved
them into MLflow's own environment variables), so nothing it writes or pickles holds a
password.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ray import tune

from hpo.tracking_uri import sqlite_path, strip_credentials
from predictors.io import atomic_write_json

# Result keys logged as step metrics, and the params logged once per trial.
STEP_METRICS = ("loss", "train_loss", "val_loss", "lr", "train_fraction", "predicted_final_loss")
TRIAL_PARAMS = (
    "eta", "eta_hidden", "batch_size", "weight_decay", "lambda_hidden", "tau",
    "tokens_per_param", "n_params", "total_tokens", "schedule", "warmup_fraction", "seed",
    "data_seed",
)
IDS_FILE = "mlflow_runs.json"
#: Scheduler statuses of a trial that will not train again.
FINISHED_STATUSES = ("completed", "stopped", "diverged", "error")


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

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # clients hold connections; rebuilt lazily after unpickling
        return state

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            if self._ids_path.exists():
                self._ids = json.loads(self._ids_path.read_text())
        return self._client

    def _save_ids(self) -> None:
        atomic_write_json(self._ids_path, self._ids, indent=1)

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            existing = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = (existing.experiment_id if existing is not None else
                                   self.client.create_experiment(self.experiment,
                                                                 artifact_location=self.artifact_location))
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
        parent = self.parent_run_id()
        for key, value in tags.items():
            self.client.set_tag(parent, key, _param_value(value))

    def log_parent_artifacts(self, paths: list[Path]) -> None:
        parent = self.parent_run_id()
        for path in paths:
            if path.is_dir():
                self.client.log_artifacts(parent, str(path), artifact_path=path.name)
            elif path.exists():
                self.client.log_artifact(parent, str(path))

    def finish_parent(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_run_id(), status=status)

    # ------------------------------------------------------------------ children

    def _find_child(self, trial_id: str) -> Optional[str]:
        """A child run of this parent already tagged with ``trial_id`` (oldest first)."""
        runs = self.client.search_runs(
            [self.experiment_id()],
            filter_string=f"tags.trial_id = '{trial_id}' and tags.`mlflow.parentRunId` = '{self.parent_run_id()}'",
            order_by=["attributes.start_time ASC"], max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def child_run_id(self, trial_id: str, trial_name: str) -> str:
        client = self.client
        run_id = self._ids["trials"].get(trial_id) or self._find_child(trial_id)
        if run_id is None:
            run = client.create_run(
                self.experiment_id(), run_name=trial_name,
                tags={"mlflow.parentRunId": self.parent_run_id(), "trial_id": trial_id,
                      "status": "running"},
            )
            run_id = run.info.run_id
        if self._ids["trials"].get(trial_id) != run_id:
            self._ids["trials"][trial_id] = run_id
            self._save_ids()
        return run_id

    def reopen_child(self, trial_id: str, trial_name: str) -> str:
        """The trial's child run, set RUNNING again if an earlier driver run closed it."""
        run_id = self.child_run_id(trial_id, trial_name)
        if run_id not in self._reopened:
            self._reopened.add(run_id)
            if self.client.get_run(run_id).info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
        return run_id

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
            if self.client.get_run(run_id).info.status == "RUNNING":
                self.close_child(trial_id, verdict(record), "FAILED" if record.get("status") == "error" else "FINISHED")
                closed += 1
        return closed

    def close_open_children(self, status: str) -> None:
        for run_id in self._ids["trials"].values():
            if self.client.get_run(run_id).info.status == "RUNNING":
                self.client.set_terminated(run_id, status=status)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:6000]


class MlflowSweepCallback(tune.Callback):
    """Tune callback writing each trial's params, step metrics and final status tag.

    Args:
        tracker: the sweep's :class:`SweepTracker`.
        trial_status: maps a trial id to its verdict (``completed``,
            ``stopped_at_<fraction>``, ``diverged``), normally the scheduler's view.
        predicted_final: maps a trial id to its latest predicted final loss, or None.
    """

    def __init__(self, tracker: SweepTracker, trial_status: Callable[[str], str],
                 predicted_final: Callable[[str], Optional[float]] = lambda _: None) -> None:
        self.tracker = tracker
        self.trial_status = trial_status
        self.predicted_final = predicted_final
        self._params_logged: set[str] = set()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        from mlflow.entities import Metric, Param

        run_id = self.tracker.reopen_child(trial.trial_id, str(trial))
        client = self.tracker.client
        if trial.trial_id not in self._params_logged:
            params = [Param(k, _param_value(result[k])) for k in TRIAL_PARAMS if k in result]
            # The searched keys under the names the sweep YAML and the report use (``lr``, …),
            # so filtering the MLflow UI by them works; the trainer's names (``eta``) stay too.
            named = {p.key for p in params}
            params += [Param(str(k), _param_value(v)) for k, v in (trial.config or {}).items()
                       if not str(k).startswith("_") and str(k) not in named]
            existing = client.get_run(run_id).data.params
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
        metrics = []
        for key in STEP_METRICS:
            value = values.get(key)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                metrics.append(Metric(key, float(value), now, step))
        if metrics:
            client.log_batch(run_id, metrics=metrics)

    def _close(self, trial: Any, failed: bool) -> None:
        status = "error" if failed else self.trial_status(trial.trial_id)
        last = getattr(trial, "last_result", None) or {}
        final = last.get("smoothed_loss")
        if (status == "completed" and isinstance(final, (int, float)) and math.isfinite(float(final))
                and float(last.get("train_fraction", 0.0)) >= 1.0 - 1e-9):
            # The one final loss (predictors.smoothing.FINAL_LOSS_DEFINITION) as its own metric.
            from mlflow.entities import Metric

            run_id = self.tracker.child_run_id(trial.trial_id, str(trial))
            self.tracker.client.log_batch(run_id, metrics=[
                Metric("final_loss", float(final), int(time.time() * 1000), int(last.get("step", 0)))])
        self.tracker.close_child(trial.trial_id, status, "FAILED" if failed else "FINISHED")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=True)
