"""MLflow records of a sweep: one parent run, one nested child run per trial.

Logging happens on the Ray driver (a Tune ``Callback``), not inside the trial processes.
Reasons: a single writer is what a SQLite store wants (concurrent trial processes writing
one SQLite file hit lock errors), the driver is the only process that knows the scheduler's
verdict (``stopped_at_<fraction>``, ``diverged``), and it works unchanged on a multi-node
cluster where trial processes could not reach a local database. The tracking URI is made
absolute (Ray changes each trial's working directory, which breaks relative URIs, ray
#36257) and is also exported as ``MLFLOW_TRACKING_URI`` to trial processes for users'
own trainables.

Run ids are persisted in ``<output>/mlflow_runs.json`` so that ``hpo resume`` keeps
writing to the same parent and child runs.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ray import tune

# Result keys logged as step metrics, and the params logged once per trial.
STEP_METRICS = ("loss", "train_loss", "val_loss", "lr", "train_fraction", "predicted_final_loss")
TRIAL_PARAMS = (
    "eta", "eta_hidden", "batch_size", "weight_decay", "lambda_hidden", "tau",
    "tokens_per_param", "n_params", "total_tokens", "schedule", "warmup_fraction", "seed",
    "data_seed",
)


def absolute_tracking_uri(uri: str) -> str:
    """Make ``sqlite:///relative.db`` and plain paths absolute; leave servers alone."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if "://" not in uri:
        return Path(uri).resolve().as_uri()
    return uri


class SweepTracker:
    """Owns the parent run and the trial → child-run mapping (persisted to JSON)."""

    def __init__(self, tracking_uri: str, experiment: str, output_dir: Path, sweep_name: str,
                 artifact_location: Optional[str] = None) -> None:
        self.tracking_uri = absolute_tracking_uri(tracking_uri)
        # Where a newly created experiment stores artifacts. MLflow's default is ./mlruns
        # relative to the working directory, which would scatter artifacts; with the default
        # SQLite store we keep them beside it in the output directory.
        self.artifact_location = artifact_location
        self.experiment = experiment
        self.output_dir = Path(output_dir)
        self.sweep_name = sweep_name
        self._client: Any = None
        self._ids_path = self.output_dir / "mlflow_runs.json"
        self._ids: dict[str, Any] = {"parent": None, "trials": {}}

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
        tmp = self._ids_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._ids, indent=1))
        os.replace(tmp, self._ids_path)

    def experiment_id(self) -> str:
        existing = self.client.get_experiment_by_name(self.experiment)
        if existing is not None:
            return existing.experiment_id
        return self.client.create_experiment(self.experiment, artifact_location=self.artifact_location)

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

    def child_run_id(self, trial_id: str, trial_name: str) -> str:
        client = self.client
        run_id = self._ids["trials"].get(trial_id)
        if run_id is None:
            run = client.create_run(
                self.experiment_id(), run_name=trial_name,
                tags={"mlflow.parentRunId": self.parent_run_id(), "trial_id": trial_id,
                      "status": "running"},
            )
            run_id = self._ids["trials"][trial_id] = run.info.run_id
            self._save_ids()
        return run_id

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

        run_id = self.tracker.child_run_id(trial.trial_id, str(trial))
        client = self.tracker.client
        if trial.trial_id not in self._params_logged:
            params = [Param(k, _param_value(result[k])) for k in TRIAL_PARAMS if k in result]
            existing = client.get_run(run_id).data.params
            params = [p for p in params if p.key not in existing]
            if params:
                client.log_batch(run_id, params=params)
            self._params_logged.add(trial.trial_id)
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
        run_id = self.tracker.child_run_id(trial.trial_id, str(trial))
        status = "error" if failed else self.trial_status(trial.trial_id)
        self.tracker.client.set_tag(run_id, "status", status)
        self.tracker.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial, failed=True)
