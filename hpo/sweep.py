"""Run (or resume) a sweep: Ray Tune + CollapseScheduler + MLflow + report.

``run_sweep(config)`` is what ``hpo sweep`` calls; ``resume_sweep(output_dir)`` is what
``hpo resume`` calls. Both end by writing the report into ``<output>/report``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import yaml

from hpo.early_answer import EarlyAnswer
from hpo.overrides import ConfigError
from hpo.sweep_config import SweepConfig, load_sweep_config
from hpo.tracking import MlflowSweepCallback, SweepTracker

STATE_FILE = "scheduler_state.json"
CONFIG_FILE = "sweep.yaml"


def _search_space(config: SweepConfig) -> dict[str, Any]:
    from ray import tune

    space: dict[str, Any] = {}
    for name, dim in config.search_space.items():
        cast = int if name in ("batch_size", "seed") else float
        if dim.grid is not None:
            space[name] = tune.grid_search([cast(v) for v in dim.grid])
        elif dim.choice is not None:
            space[name] = tune.choice([cast(v) for v in dim.choice])
        else:
            low, high = dim.loguniform  # type: ignore[misc]
            space[name] = tune.loguniform(low, high)
    return space


def _base_trainer(config: SweepConfig) -> dict[str, Any]:
    """The trainer base config with paths made absolute (Ray changes trial working dirs)."""
    base = config.base_trainer()
    data = dict(base.get("data") or {})
    corpus = data.get("corpus")
    if corpus and corpus != "stdlib":
        data["corpus"] = str(Path(corpus).resolve())
        base["data"] = data
    return base


def _trainable(config: SweepConfig) -> Any:
    from ray import tune

    from hpo.trainable import CollapseTrainable

    resources = {"cpu": config.resources.cpu, "gpu": config.resources.gpu}
    return tune.with_resources(
        tune.with_parameters(CollapseTrainable, base_trainer=_base_trainer(config)), resources
    )


def _init_ray(config: SweepConfig, address: Optional[str], tracking_uri: str) -> None:
    import ray

    if ray.is_initialized():
        return
    address = address or config.ray.address or os.environ.get("RAY_ADDRESS")
    env = {"MLFLOW_TRACKING_URI": tracking_uri}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        # address="local": always a fresh local instance, never a cluster that happens to run here.
        ray.init(address="local", num_cpus=config.ray.num_cpus or os.cpu_count(), include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=False)


def build_scheduler(config: SweepConfig, output: Path, early_answer: Any) -> Any:
    from hpo.scheduler import CollapseScheduler
    from predictors import Predictor

    predictor = Predictor.load(output / "predictor.json")
    return CollapseScheduler(
        predictor=predictor,
        metric=config.scheduler.metric,
        mode="min",
        rungs=tuple(config.scheduler.rungs),
        reduction_factor=config.scheduler.reduction_factor,
        margin=config.scheduler.margin,
        margin_z=config.scheduler.margin_z,
        decision_mode=config.scheduler.mode,
        state_path=output / STATE_FILE,
        on_early_answer=early_answer,
    )


def prepare_output(config: SweepConfig) -> Path:
    """Create the output directory and write the resolved config and predictor copy.

    Called only after validation, so a bad config writes nothing.
    """
    predictor_path = config.predictor_path()
    if not predictor_path.exists():
        raise ConfigError(f"predictor: {predictor_path}: no such file")
    from predictors import Predictor

    try:
        Predictor.load(predictor_path)  # validate before writing anything
    except ValueError as exc:  # the message names the file and the field
        raise ConfigError(f"predictor: {exc}") from None
    output = config.output_path()
    if (output / STATE_FILE).exists():
        raise ConfigError(
            f"output_dir: {output} already holds a sweep; use `hpo resume {output}` or pick "
            "another output_dir"
        )
    output.mkdir(parents=True, exist_ok=True)
    resolved = config.model_dump(mode="json")
    # Absolute paths, so `hpo resume <output>` works from any working directory.
    resolved["output_dir"] = str(output)
    resolved["predictor"] = str(output / "predictor.json")
    (output / CONFIG_FILE).write_text(yaml.safe_dump(resolved, sort_keys=False))
    shutil.copyfile(predictor_path, output / "predictor.json")
    return output


def _execute(config: SweepConfig, output: Path, address: Optional[str], restore: bool) -> dict[str, Any]:
    from ray import tune

    from hpo.progress import SweepProgress
    from hpo.report import write_report
    from hpo.trainable import short_trial_dirname

    artifacts = None if config.mlflow.tracking_uri else (output / "mlartifacts").as_uri()
    tracker = SweepTracker(config.tracking_uri(), config.mlflow.experiment, output, config.name,
                           artifact_location=artifacts)
    tracker.parent_run_id(params={
        "sweep": config.name, "scheduler_mode": config.scheduler.mode,
        "rungs": config.scheduler.rungs, "search_space": {
            k: v.model_dump(exclude_none=True) for k, v in config.search_space.items()},
    })
    _init_ray(config, address, tracker.tracking_uri)
    experiment_path = output / "ray" / config.name
    if restore:
        if not tune.Tuner.can_restore(str(experiment_path)):
            raise ConfigError(f"{output}: no Ray experiment to resume at {experiment_path}")
        tuner = tune.Tuner.restore(str(experiment_path), trainable=_trainable(config),
                                   resume_unfinished=True, resume_errored=True)
    else:
        early = EarlyAnswer(output, tracker)
        scheduler = build_scheduler(config, output, early)
        progress = SweepProgress(scheduler)
        mlflow_cb = MlflowSweepCallback(tracker, scheduler.trial_verdict, scheduler.latest_prediction)
        # In sync mode, paused trials count as live for max_concurrent_trials, which would
        # starve the rung of trials; concurrency then comes from per-trial resources alone.
        max_concurrent = (config.ray.max_concurrent_trials
                          if config.scheduler.mode != "sync" else None)
        tuner = tune.Tuner(
            _trainable(config),
            param_space=_search_space(config),
            tune_config=tune.TuneConfig(
                metric=config.scheduler.metric, mode="min", scheduler=scheduler,
                num_samples=config.num_samples, max_concurrent_trials=max_concurrent,
                trial_dirname_creator=short_trial_dirname, reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=config.name, storage_path=str(output / "ray"), verbose=0,
                callbacks=[mlflow_cb, progress],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=25),
                failure_config=tune.FailureConfig(max_failures=1),
            ),
        )
    results = tuner.fit()
    errors = [str(e) for e in getattr(results, "errors", [])]
    report = write_report(output)
    state = json.loads((output / STATE_FILE).read_text()) if (output / STATE_FILE).exists() else {}
    for trial_id, trial in state.get("trials", {}).items():
        try:
            run_id = tracker.child_run_id(trial_id, trial_id)
            tracker.client.set_tag(run_id, "status", verdict_from_state(trial))
            tracker.client.set_terminated(run_id, status="FINISHED")
        except Exception:  # noqa: BLE001 - a tracking hiccup must not lose the report
            pass
    tracker.log_parent_artifacts([output / "report", output / STATE_FILE,
                                  output / "predicted_best.json", output / CONFIG_FILE])
    tracker.finish_parent("FAILED" if errors else "FINISHED")
    return {"output": str(output), "report": report, "errors": errors}


def verdict_from_state(trial: dict[str, Any]) -> str:
    """The MLflow status tag of a trial from its persisted scheduler record."""
    status = trial.get("status")
    if status == "diverged":
        return "diverged"
    if status == "stopped" and trial.get("stopped_at") is not None:
        return f"stopped_at_{trial['stopped_at']:g}"
    if status == "error":
        return "error"
    return "completed" if status == "completed" else str(status)


def run_sweep(config: SweepConfig, address: Optional[str] = None) -> dict[str, Any]:
    output = prepare_output(config)
    return _execute(config, output, address, restore=False)


def resume_sweep(output_dir: str, address: Optional[str] = None) -> dict[str, Any]:
    output = Path(output_dir).resolve()
    if not (output / CONFIG_FILE).exists():
        raise ConfigError(f"{output}: not a sweep output directory (no {CONFIG_FILE})")
    config = load_sweep_config(output / CONFIG_FILE)
    return _execute(config, output, address, restore=True)
