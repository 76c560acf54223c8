"""Run (or resume) a sweep: Ray Tune + CollapseScheduler + MLflow + report.

``run_sweep(config)`` is what ``hpo sweep`` calls; ``resume_sweep(output_dir)`` is what
``hpo resume`` calls. Both end by writing the report into ``<output>/report``.

Order of work, so that bad input writes nothing: :func:`preflight_sweep` /
:func:`preflight_resume` check everything that can be checked without writing (config,
predictor file, output directory, tracking URI, a resumable Ray experiment) and import neither
Ray nor MLflow; then Ray starts; only then are files and MLflow runs created.

Resuming. Everything a resumed sweep writes is built from the directory being resumed: the
scheduler (its state file), the MLflow tracker and the early answer are constructed anew for
that directory and handed to ``tune.run(resume_config=...)``, which restores Ray's trials
from the experiment state in ``<output>/ray/<name>``. (``Tuner.restore`` would instead unpickle
the scheduler and callbacks built for the original directory, and a copied or moved sweep
would go on writing there.) A default SQLite store moved with the folder has its artifact
locations re-pointed (``hpo.tracking.runs.relocate_sqlite_store``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from hpo.common.output_lock import hold_folder
from hpo.common.paths import check_output_dir
from hpo.decisions.scheduler_records import TrialStatus
from hpo.common.overrides import ConfigError, read_yaml
from hpo.trials.sweep_config import SweepConfig, load_sweep_config
from hpo.tracking.uri import (LOCAL_UI, TrackingUriError, check_tracking_uri, experiment_page, is_relative_sqlite,
                              strip_credentials, use_credentials)
from predictors.io import atomic_write_bytes, atomic_write_text
from predictors.run_keys import METRIC_WORDS

STATE_FILE = "scheduler_state.json"
CONFIG_FILE = "sweep.yaml"
PREDICTOR_FILE = "predictor.json"
#: Set by ``hpo submit`` in the Ray Job's environment: the job id the parent run is tagged with.
JOB_ID_ENV = "HPO_JOB_ID"
#: Files whose presence means a directory already holds a sweep.
SWEEP_MARKERS = (CONFIG_FILE, STATE_FILE, "mlflow_runs.json", "ray")


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


def experiment_dir(config: SweepConfig) -> Path:
    """The Ray experiment folder of a sweep: ``<output>/ray/<name>``."""
    return config.output_path() / "ray" / config.name


def _trainable(config: SweepConfig) -> Any:
    from ray import tune

    from hpo.trials.trainable import CollapseTrainable

    resources = {"cpu": config.resources.cpu, "gpu": config.resources.gpu}
    if config.resources.memory_mb is not None:  # Ray places a trial only where this much is free
        resources["memory"] = int(config.resources.memory_mb * 2**20)
    return tune.with_resources(
        tune.with_parameters(CollapseTrainable, base_trainer=_base_trainer(config),
                             experiment_dir=str(experiment_dir(config))),
        resources,
    )


def _init_ray(config: SweepConfig, address: Optional[str], tracking_uri: str) -> None:
    import ray

    if ray.is_initialized():
        return
    address = address or config.ray.address or os.environ.get("RAY_ADDRESS")
    env = {"MLFLOW_TRACKING_URI": strip_credentials(tracking_uri)}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        # address="local": always a fresh local instance, never a cluster that happens to run here.
        ray.init(address="local", num_cpus=config.ray.num_cpus or os.cpu_count(), include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=False)


def start_ray_then_credentials(config: SweepConfig, address: Optional[str]) -> str:
    """Start (or join) Ray, then hand the tracking URI's credentials to MLflow; returns the URI
    without them. In this order because Ray's processes (GCS, raylet, agents, and the workers
    the raylet starts later) copy this process's environment when they start: credentials put
    there first (MLflow reads them from MLFLOW_TRACKING_USERNAME / _PASSWORD) were in every
    Ray process's /proc/<pid>/environ. Ray gets the URI stripped."""
    _init_ray(config, address, strip_credentials(config.tracking_uri()))
    return use_credentials(config.tracking_uri())


def build_scheduler(config: SweepConfig, output: Path, early_answer: Any, predictor: Any,
                    resume: bool = False, on_decision: Any = None) -> Any:
    """The sweep's CollapseScheduler on ``predictor`` (the sweep's copy, loaded once by
    ``_execute`` and shared with the report); ``resume`` continues the decisions saved in
    ``output`` (a sweep killed before its first state write has none yet, and starts afresh);
    ``on_decision`` gets every rung decision the moment it is made (printed and published on MLflow)."""
    from hpo.decisions.scheduler import CollapseScheduler

    return CollapseScheduler(predictor=predictor, settings=config.scheduler, state_path=output / STATE_FILE,
                             on_early_answer=early_answer, on_decision=on_decision,
                             resume=resume and (output / STATE_FILE).exists())


def predictor_line(config: SweepConfig, predictor: Any) -> str:
    """The one line a sweep starts with about its predictor: which file, the sizes it was fitted on,
    the sweep's N, and whether the sweep is so far beyond them that it ranks by the losses."""
    n = config.n_params()
    sizes = [float(v) for v in predictor.provenance.get("model_sizes") or []]
    which = f"the sweep's own {config.predictor}" if config.predictor else f"packaged {config.predictor_path().name}"
    fitted = f"fitted at N = {min(sizes):.3g}–{max(sizes):.3g}" if sizes else "fitted sizes not recorded"
    line = f"predictor: {which} ({fitted}); this sweep's N = {n:.3g}" if n else f"predictor: {which} ({fitted})"
    note = predictor.off_scale_note(n)
    return line + (f"\nwarning: {note}" if note else "")


# ----------------------------------------------------------------------------- checks (no writes)


def check_predictor(path: Path, field: str = "predictor", metric: Optional[str] = None) -> None:
    """Refuse a predictor path that is missing, a directory, or not a valid predictor file, and
    (``metric``: the sweep's ``scheduler.metric``) one fitted on another metric: its shape, its
    stated errors and its ranking scales were measured on that curve, not on this one."""
    if not path.exists():
        raise ConfigError(f"{field}: {path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{field}: {path}: is a directory, not a predictor JSON file")
    from predictors import Predictor

    try:
        predictor = Predictor.load(path)
    except (ValueError, OSError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        message = " ".join(str(exc).split())
        raise ConfigError(f"{field}: {message if str(path) in message else f'{path}: {message}'}") from None
    if metric is not None and predictor.metric != metric:
        raise ConfigError(f"{field}: {path} was fitted on {predictor.metric} ({METRIC_WORDS.get(predictor.metric, '?')}), "
                          f"but scheduler.metric is {metric}; calibrate one on it (`hpo calibrate` with "
                          f"metric: {metric}) or set scheduler.metric: {predictor.metric}")


def _check_tracking(config: SweepConfig) -> None:
    uri = config.mlflow.tracking_uri
    if not uri:  # the sweep's own store in its output folder: where it exists, SQLite must open it
        own = config.output_path() / "mlflow.db"
        if own.is_file():
            try:
                check_tracking_uri(config.tracking_uri(), "output_dir")
            except TrackingUriError as exc:
                raise ConfigError(str(exc)) from None
    if uri:
        try:
            check_tracking_uri(uri, "mlflow.tracking_uri")
        except TrackingUriError as exc:
            raise ConfigError(str(exc)) from None
        if is_relative_sqlite(uri):
            # sweep.yaml keeps the URI as given: `hpo resume` (or Ray's workers) run from another
            # directory would open another database.
            raise ConfigError(f"mlflow.tracking_uri: {strip_credentials(uri)}: a relative database path depends "
                              "on the directory each command runs from; give an absolute one, "
                              "sqlite:////ABSOLUTE/PATH.db (or leave the URI out: the sweep's own store "
                              "in its output folder)")


def artifact_location(config: SweepConfig, output: Path) -> Optional[str]:
    """Where a new MLflow experiment of the sweep keeps its artifacts: the output folder,
    unless a tracking server decides. MLflow's default for a store the client opens itself
    (SQLite, a database) is ./mlruns in whatever directory the driver runs from."""
    uri = config.mlflow.tracking_uri or ""
    if uri.lower().startswith(("http://", "https://", "databricks", "uc:")):
        return None
    return (output / "mlartifacts").as_uri()


def preflight_portable(config: SweepConfig) -> None:
    """The checks of :func:`preflight_sweep` that hold on any machine: the predictor file loads
    and the tracking URI works. ``hpo submit`` runs them (after the same ``load_sweep_config``)
    on the client, before anything reaches the cluster; the output-directory checks run on the
    cluster, where the directory is."""
    check_predictor(config.predictor_path(), metric=config.scheduler.metric)
    _check_tracking(config)


def preflight_sweep(config: SweepConfig) -> Path:
    """Every check of a new sweep that needs no write; returns the output directory."""
    preflight_portable(config)
    check_output_dir(config.output_given(), "output_dir")  # empty, a dangling link, a file, not writable
    output = config.output_path()
    held = [m for m in SWEEP_MARKERS if (output / m).exists()]
    if held and not _started(config, output) and not _changed_fields(config, output):
        return output  # an earlier start of this very sweep failed before Ray saved anything: start again
    if held:
        changed = _changed_fields(config, output)
        if changed:
            # `hpo resume` continues the sweep as it was configured; it would not apply these.
            raise ConfigError(
                f"output_dir: {output} already holds a sweep ({held[0]}) with another config (differs in "
                f"{', '.join(changed[:6])}{' and more' if len(changed) > 6 else ''}); run this one into a new "
                f"directory (--output DIR); `hpo resume {output}` would continue the old config unchanged")
        raise ConfigError(f"output_dir: {output} already holds a sweep ({held[0]}); continue it with "
                          f"`hpo resume {output}`, or start afresh into another directory (--output DIR)")
    return output


def _started(config: SweepConfig, output: Path) -> bool:
    """Whether the sweep in ``output`` got far enough to be resumed (Ray saved its experiment
    state, or the scheduler its decisions). A start that failed before that (Ray could not
    start, the tracking store refused a write, ...) leaves a folder that ``hpo sweep`` may
    start into again with the same config, never one that can be neither swept nor resumed."""
    return (output / STATE_FILE).exists() or any(experiment_dir(config).glob("experiment_state-*.json"))


def _changed_fields(config: SweepConfig, output: Path) -> list[str]:
    """Dotted names of the config fields that differ from the sweep saved in ``output``
    (paths that ``sweep.yaml`` stores resolved are left out); [] when they match or the saved
    config cannot be read."""
    try:
        saved = read_yaml(str(output / CONFIG_FILE))
    except Exception:  # noqa: BLE001 - no readable sweep.yaml: nothing to compare
        return []
    if not isinstance(saved, dict):
        return []

    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                out.update(flat(item, f"{prefix}{key}."))
            return out
        return {prefix[:-1]: value}

    ignore = {"output_dir", "predictor", "mlflow.tracking_uri"}
    new, old = flat(config.model_dump(mode="json")), flat(saved)
    return sorted(k for k in set(new) | set(old) if k not in ignore and new.get(k) != old.get(k))


def preflight_resume(output_dir: str | Path) -> tuple[SweepConfig, Path, Path]:
    """Every check of ``hpo resume`` that needs no write.

    Returns the config (its ``output_dir`` and ``predictor`` re-pointed at ``output_dir``:
    a copied or moved sweep is resumed where it is now), the output directory, and the
    directory the sweep was created in (from ``sweep.yaml``).
    """
    output = Path(output_dir).resolve()
    if not output.exists():
        raise ConfigError(f"{output_dir}: no such directory")
    if not output.is_dir():
        raise ConfigError(f"{output_dir}: not a directory")
    config_path = output / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(f"{output}: not a sweep output directory (no {CONFIG_FILE})")
    raw = read_yaml(str(config_path))
    created_in = Path(str(raw.get("output_dir") or output))
    raw.update(output_dir=str(output), predictor=str(output / PREDICTOR_FILE))
    config = load_sweep_config(data=raw, source=str(config_path))
    experiment = experiment_dir(config)
    if not any(experiment.glob("experiment_state-*.json")):
        raise ConfigError(f"{output}: nothing to resume: no Ray experiment state in {experiment} (the sweep "
                          "ended before Ray saved any); start it again with `hpo sweep` (same config and "
                          "output_dir), or into a new output_dir")
    check_predictor(output / PREDICTOR_FILE, metric=config.scheduler.metric)
    if (output / STATE_FILE).exists():
        from hpo.decisions.scheduler_state import SchedulerState

        from hpo.decisions.scheduler_state import rule_settings, rule_words, same_rule

        state = SchedulerState.load(output / STATE_FILE)  # a malformed state: StateFileError naming the file
        recorded = rule_settings(state.settings)
        if not same_rule(recorded, config.scheduler.rule):
            raise ConfigError(f"{config_path}: scheduler.rule is {rule_words(config.scheduler.rule)}, but the "
                              f"decisions in {STATE_FILE} were made with {rule_words(recorded)}; resume with the "
                              "rule it was started with, or start afresh into another output_dir")
    for written in (output / STATE_FILE, output / "mlflow.db", output / CONFIG_FILE):
        if written.exists() and not os.access(written, os.W_OK):  # immutable, or another user's
            raise ConfigError(f"{written}: not writable; the resumed sweep writes it (make it writable, "
                              "or copy the folder and resume the copy)")
    _check_tracking(config)
    return config, output, created_in


# ----------------------------------------------------------------------------- writes


def resolved_config_text(config: SweepConfig, output: Path) -> str:
    """``sweep.yaml``: the resolved config with absolute paths and no credentials."""
    resolved = config.model_dump(mode="json")
    # Absolute paths, so `hpo resume <output>` works from any working directory.
    resolved["output_dir"] = str(output)
    resolved["predictor"] = str(output / PREDICTOR_FILE)
    if resolved["mlflow"].get("tracking_uri"):
        resolved["mlflow"]["tracking_uri"] = strip_credentials(resolved["mlflow"]["tracking_uri"])
    return yaml.safe_dump(resolved, sort_keys=False)


def prepare_output(config: SweepConfig) -> Path:
    """Create the output directory and write the resolved config and predictor copy.

    Called only after :func:`preflight_sweep`, so a bad config writes nothing.
    """
    output = config.output_path()
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / CONFIG_FILE, resolved_config_text(config, output))
    atomic_write_bytes(output / PREDICTOR_FILE, config.predictor_path().read_bytes())
    return output


def _relocate(config: SweepConfig, output: Path, created_in: Path) -> None:
    """A sweep resumed somewhere else than where it was created: point its own records here."""
    from hpo.tracking.runs import relocate_sqlite_store

    if created_in.resolve() == output:
        return
    if not config.mlflow.tracking_uri:  # the default store lives in (and moved with) the folder
        relocate_sqlite_store(config.tracking_uri(), created_in, output)
    atomic_write_text(output / CONFIG_FILE, resolved_config_text(config, output))


def _state(output: Path) -> dict[str, Any]:
    path = output / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def verdict_from_state(trial: dict[str, Any]) -> str:
    """The MLflow status tag of a trial from its persisted scheduler record."""
    from hpo.decisions.scheduler_records import verdict

    return verdict(trial.get("status"), trial.get("stopped_at"))


def diverged_trials(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The scheduler records of trials that diverged, in trial order."""
    trials = state.get("trials", {})
    return [dict(t, trial_id=tid) for tid, t in sorted(trials.items(), key=lambda kv: kv[1].get("order", 0))
            if t.get("status") == TrialStatus.DIVERGED or t.get("diverged_at") is not None]


def _execute(config: SweepConfig, output: Path, address: Optional[str], restore: bool,
             created_in: Optional[Path] = None) -> dict[str, Any]:
    from ray import tune
    from ray.tune import ResumeConfig
    from ray.tune.stopper import CombinedStopper

    from hpo.decisions.early_answer import EarlyAnswer
    from hpo.reporting.progress import RungAnnouncer, SlotUse, SweepProgress
    from hpo.tracking.runs import JOB_TAG, LiveStopper, MlflowResultLog, MlflowSweepCallback, SweepTracker
    from hpo.trials.trainable import short_trial_dirname
    from predictors import Predictor

    # The sweep prints where its records are once, at start and in the summary; MLflow's own
    # "View run ... at" line for every run it ends (an http server) would bury the rung lines.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Every rung pauses its survivors with a checkpoint, and Ray forces an experiment snapshot
    # after num_to_keep of them (so that a resume finds them): by design, several in a few
    # seconds on short trials. Ray's "excessive sync" warning about it is noise here; its
    # warning for a *slow* snapshot (TUNE_WARN_SLOW_..., 30 s) stays on.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    tracking_uri = start_ray_then_credentials(config, address)
    # After ray.init, which installs a SIGTERM handler that aborts the driver mid-run.
    from hpo.service.stop_signal import DeferredStop, stop_like_ctrl_c

    stop_like_ctrl_c(f"continue it with `hpo resume {output}`")
    if restore:
        _relocate(config, output, created_in or output)
    else:
        prepare_output(config)
    artifacts = artifact_location(config, output)
    tracker = SweepTracker(tracking_uri, config.mlflow.experiment, output, config.name,
                           artifact_location=artifacts)
    # Every scheduler setting is a param, the rule's knobs each its own (rule.settings(): two
    # sweeps that differ only in the collapse rule's margin_z differ in MLflow).
    scheduler = config.scheduler.model_dump()
    rule = scheduler.pop("rule")
    params = {"sweep": config.name, **{f"scheduler.{k}": v for k, v in scheduler.items()},
              "scheduler.rule": rule["name"], **{f"scheduler.rule.{k}": v for k, v in rule.items() if k != "name"},
              "search": config.search.model_dump(exclude_none=True),
              "search_space": {k: v.model_dump(exclude_none=True) for k, v in config.search_space.items()}}
    with tracker.running(params):
        if restore:  # what an earlier driver could not send (its server was away) goes first
            tracker.upload_pending()
        job_id = os.environ.get(JOB_ID_ENV)
        if job_id:  # submitted with `hpo submit`: clients find this run by the job id
            tracker.tag_parent({JOB_TAG: job_id})
        mlflow_where = mlflow_location(tracking_uri, config.mlflow.experiment, tracker.experiment_id())
        print(mlflow_where["text"], flush=True)
        early = EarlyAnswer(output, tracker)
        # The predictor is read once here, from the sweep's own copy, for the scheduler and the
        # report (preflight only checked that the user's file loads, before anything was written).
        predictor = dataclasses.replace(Predictor.load(output / PREDICTOR_FILE),
                                        trust_off_scale=config.scheduler.trust_off_scale)
        print(predictor_line(config, predictor), flush=True)
        # Each rung decision is printed as it is made (before the early answer that follows
        # from it) and published on the MLflow parent run for `hpo status` / `hpo answer`.
        announcer = RungAnnouncer(publish=tracker.publish_decision)
        scheduler = build_scheduler(config, output, early, predictor, resume=restore, on_decision=announcer)
        if restore:
            tracker.close_finished(_state(output).get("trials", {}), verdict_from_state)
            restore_early_answer(output, early, tracker)
        slot_use = SlotUse(_trial_slots(config))
        progress = SweepProgress(scheduler, announcer=announcer, slots=slot_use.slots)
        result_log = MlflowResultLog(tracker)  # first of the stoppers: before the scheduler sees a result
        mlflow_cb = MlflowSweepCallback(tracker, scheduler.trial_verdict, scheduler.latest_prediction,
                                        result_log=result_log, metric=config.scheduler.metric)
        monitor_cbs, monitor_stopper = _monitor(config, predictor, tracker)
        stopper = LiveStopper(CombinedStopper(result_log, monitor_stopper) if monitor_stopper else result_log)
        # What tune.run makes its Experiment of (a rebuilt searcher is handed the same one).
        experiment = dict(
            name=config.name, storage_path=str(output / "ray"),
            config=_search_space(config), num_samples=config.num_samples,
            trial_dirname_creator=short_trial_dirname, stop=stopper,
            # No checkpoint at end: the trainable writes its own final checkpoint before its
            # last result leaves the worker (hpo.trials.trainable).
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=25,
                                                    checkpoint_at_end=False),
            max_failures=1)
        search_alg = _search_alg(config, scheduler, slot_use.slots,
                                 (output, lambda: tune.Experiment(run=_trainable(config), **experiment))
                                 if restore else None)
        analysis = tune.run(
            _trainable(config), **experiment,
            metric=config.scheduler.metric, mode="min",
            scheduler=scheduler, search_alg=search_alg,  # the search algorithm holds the concurrency limit
            reuse_actors=True, verbose=0,
            callbacks=[mlflow_cb, progress, slot_use, *monitor_cbs, DeferredStop()],
            raise_on_failed_trial=False,
            resume_config=(ResumeConfig(unfinished=ResumeConfig.ResumeType.RESUME,
                                        errored=ResumeConfig.ResumeType.RESUME) if restore else None),
        )
        outcome = _close(output, analysis, scheduler, tracker, predictor)
    return {"output": str(output), **outcome, "slot_use": slot_use.utilisation(), "mlflow": mlflow_where}


def _search_alg(config: SweepConfig, scheduler: Any, slots: int,
                resumed: Optional[tuple[Path, Callable[[], Any]]] = None) -> Any:
    """The sweep's search algorithm (``hpo.trials.search``), holding the concurrency limit.

    In sync mode Ray counts PAUSED trials as live, so a limit would leave only that many trials
    at the first rung: concurrency then comes from per-trial resources alone, unless the user
    set ``search.max_concurrent``. A model-based searcher without one is limited to the
    cluster's trial slots, so that each trial is suggested when a slot frees (after the
    results before it), not all ``num_samples`` up front.

    ``resumed``: a resumed sweep's directory and its ``tune.Experiment`` maker: the searcher is
    restored by Ray from its saved state, or rebuilt from the recorded trials where none was
    saved (``hpo.trials.search.resume_search_alg``); the line saying which is printed."""
    from hpo.trials.search import build_search_alg, resume_search_alg, stopped_prediction

    max_concurrent = config.search.max_concurrent or (
        config.ray.max_concurrent_trials if config.scheduler.mode != "sync" else None)
    if config.search.algorithm == "optuna" and max_concurrent is None:
        max_concurrent = slots
    if resumed is None:
        return build_search_alg(config.search, stopped_prediction(scheduler), max_concurrent)
    output, make_experiment = resumed
    search_alg, line = resume_search_alg(config.search, stopped_prediction(scheduler),
                                         output / "ray" / config.name, scheduler.state.trials,
                                         config.num_samples, max_concurrent, make_experiment)
    print(line, flush=True)
    return search_alg


def restore_early_answer(output: Path, early: Any, tracker: Any) -> bool:
    """On resume: the early answer the scheduler state holds, written again to
    ``predicted_best.json`` and the MLflow parent run if either lacks it. The state is written
    first; a driver killed before the file or the tags were written lost the answer from both
    places the user reads it. True when it was rebuilt."""
    from hpo.reporting.analysis import EARLY_ANSWER_FILE
    from hpo.tracking.runs import EARLY_ANSWER_TAG

    answer = _state(output).get("early_answer")
    if not answer:
        return False
    try:
        on_disk = json.loads((output / EARLY_ANSWER_FILE).read_text()) == answer
    except (OSError, ValueError):
        on_disk = False
    try:
        tags = tracker.client.get_run(tracker.parent_run_id()).data.tags
        tagged = tags.get(EARLY_ANSWER_TAG) == "1" and tags.get("predicted_best.trial_id") == str(answer.get("trial_id"))
    except Exception:  # noqa: BLE001 - an unreadable parent: publish again
        tagged = False
    if on_disk and tagged:
        return False
    early(answer)  # writes the file, prints the answer, publishes it on the parent run
    return True


def _monitor(config: SweepConfig, predictor: Any, tracker: Any) -> tuple[list, Any]:
    """The collapse-residual monitor's Ray Tune callback and stopper (none when it is off): its own
    callback and stopper, so the scheduler is not told."""
    if not config.monitor.enabled:
        return [], None
    from hpo.monitor.live import MonitorCallback, MonitorStopper, TrialMonitor

    trial_monitor = TrialMonitor(predictor)
    callbacks = [MonitorCallback(trial_monitor, tracker, stop_on_alarm=config.monitor.stop_on_alarm)]
    return callbacks, MonitorStopper(trial_monitor, config.monitor.stop_on_alarm)


def _close(output: Path, analysis: Any, scheduler: Any, tracker: Any, predictor: Any) -> dict[str, Any]:
    """After Ray Tune returns: the report, the final MLflow records, and how the sweep ended
    (errors, diverged trials, interrupted)."""
    from ray.tune import ResultGrid

    from hpo.decisions.scheduler_state import TERMINAL_STATUSES
    from hpo.reporting.report import parent_table, pick_final_loss, write_report

    errors = [strip_credentials(str(e)) for e in ResultGrid(analysis).errors]
    # The scheduler writes its state throttled, forcing it only when no trial is alive; a
    # searcher that adds trials one by one can finish a trial after that last forced write.
    scheduler.flush()
    report = write_report(output, predictor=predictor)
    with contextlib.suppress(Exception):  # the final counts for `hpo status`; never lose the report
        tracker.publish_progress(scheduler.progress(), scheduler.compute_fraction())
    state = _state(output)
    # Ctrl-C: Ray Tune saves and ends the run, and may mark the unfinished trials TERMINATED;
    # a trial the scheduler has neither finished, stopped nor seen fail tells it apart.
    from hpo.service.stop_signal import stop_requested

    interrupted = (stop_requested() or any(t.status not in ("TERMINATED", "ERROR") for t in analysis.trials)
                   or any(t.get("status") not in TERMINAL_STATUSES for t in state.get("trials", {}).values()))
    for trial_id, trial in state.get("trials", {}).items():
        # A trial still going when the sweep was stopped is KILLED (what `hpo stop` marks it),
        # not FAILED nor FINISHED: `hpo resume` continues it.
        ended = ("FAILED" if trial.get("status") == TrialStatus.ERROR else
                 "FINISHED" if trial.get("status") in TERMINAL_STATUSES else "KILLED")
        try:
            tracker.close_child(trial_id, verdict_from_state(trial), ended)
        except Exception:  # noqa: BLE001 - a tracking hiccup must not lose the report
            pass
    with contextlib.suppress(Exception):  # the answer and the rung table on the parent run's page
        tracker.describe_sweep(report.early_answer, parent_table(report), report.compute_fraction,
                               pick_final_loss(report))
    tracker.log_parent_artifacts([output / "report", output / STATE_FILE,
                                  output / "predicted_best.json", output / CONFIG_FILE])
    diverged = diverged_trials(state)
    all_diverged = bool(state.get("trials")) and len(diverged) == len(state["trials"])
    tracker.finish_parent("KILLED" if interrupted else "FAILED" if errors or all_diverged else "FINISHED")
    waiting = tracker.upload_pending()
    if waiting:
        print(pending_line(output, waiting, tracker.tracking_uri), flush=True)
    return {"report": report, "errors": errors, "diverged": diverged, "all_diverged": all_diverged,
            "interrupted": interrupted, "mlflow_pending": waiting}


def pending_line(output: Path, waiting: int, tracking_uri: str) -> str:
    """What to do about MLflow records still waiting in the sweep folder."""
    from hpo.tracking.outbox import PENDING_FILE

    return (f"MLflow server at {strip_credentials(tracking_uri)} unreachable: {waiting} records wait in "
            f"{output / PENDING_FILE}; `hpo report {output}` sends them once it answers")


def upload_pending(output: Path) -> Optional[str]:
    """``hpo report``: send the MLflow records a sweep could not (its server was away), to the
    tracking URI and experiment of its ``sweep.yaml``; a line saying what happened, or None when
    nothing was waiting."""
    from hpo.tracking.outbox import PENDING_FILE
    from hpo.tracking.runs import SweepTracker

    if not (output / PENDING_FILE).exists():
        return None
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # one line, not one per run ended
    raw = read_yaml(str(output / CONFIG_FILE))
    raw.update(output_dir=str(output), predictor=str(output / PREDICTOR_FILE))
    config = load_sweep_config(data=raw, source=str(output / CONFIG_FILE))
    tracker = SweepTracker(use_credentials(config.tracking_uri()), config.mlflow.experiment, output, config.name)
    before = len(tracker.client.queued)
    waiting = tracker.upload_pending()
    if waiting:
        return pending_line(output, waiting, tracker.tracking_uri)
    return f"MLflow: {before} records that had waited in {output / PENDING_FILE} sent to {tracker.tracking_uri}"


def mlflow_location(tracking_uri: str, experiment: str, experiment_id: str) -> dict[str, str]:
    """Where the sweep's MLflow records are and how to browse them (credentials stripped):
    what ``mlflow ui`` and ``hpo calibrate --from-mlflow`` need."""
    uri = strip_credentials(tracking_uri)
    browse = (f"mlflow ui --backend-store-uri {uri}, then open {experiment_page(LOCAL_UI, experiment_id)}"
              if not uri.startswith(("http://", "https://")) else f"open {experiment_page(uri, experiment_id)}")
    return {"tracking_uri": uri, "experiment": experiment, "experiment_id": experiment_id,
            "text": f"MLflow: {uri}, experiment '{experiment}' (id {experiment_id}); browse: {browse}; "
                    f"reuse these curves: hpo calibrate --from-mlflow {experiment_id} --tracking-uri {uri}"}


def _trial_slots(config: SweepConfig) -> int:
    """How many trials the Ray cluster can run at once with the sweep's per-trial resources."""
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    slots = int(cpus // max(config.resources.cpu, 1e-9)) or 1
    if config.ray.max_concurrent_trials and config.scheduler.mode != "sync":
        slots = min(slots, config.ray.max_concurrent_trials)
    return slots


def _trial_extremes(config: SweepConfig) -> list[dict[str, Any]]:
    """The trainer configs of the search space's corners (what ``load_sweep_config`` validated)."""
    import itertools

    from hpo.trials.sweep_config import INTEGER_KEYS

    names = list(config.search_space)
    out = []
    for values in itertools.product(*(config.search_space[n].extremes() for n in names)):
        out.append(config.trial_trainer({n: (int(v) if n in INTEGER_KEYS else v) for n, v in zip(names, values)}))
    return out


def check_data(config: SweepConfig) -> Optional[str]:
    """The trials' corpus: a token dataset must fit ``model.vocab_size`` (one clear line if
    not). Returns the sweep's one repeated-data warning line when its longest trial reads
    the training split more than once, else None (the trials themselves stay quiet)."""
    from trainers.config import TrainConfig, run_controls
    from trainers.corpus import DataError, check_vocabulary, fingerprint, token_dataset_dir, training_tokens

    base = _base_trainer(config)
    trial = TrainConfig.model_validate(base)
    try:
        directory = token_dataset_dir(trial.data.corpus)
        if directory is not None:
            cache = Path(trial.data.cache_dir).expanduser() if trial.data.cache_dir else None
            check_vocabulary(directory, fingerprint(directory, trial.data.token_dtype, cache), trial.model.vocab_size)
        elif trial.model.vocab_size != 256:
            raise DataError(f"model.vocab_size: {trial.model.vocab_size} needs a token dataset, but "
                            f"data.corpus {trial.data.corpus!r} is read as bytes (V = 256)")
        available = training_tokens(trial.data.model_dump())
    except (DataError, OSError) as exc:
        said = isinstance(exc, DataError) or str(exc).startswith("data.")  # the message names its field
        raise ConfigError(f"{config.name}: trainer.{exc}" if said else
                          f"{config.name}: trainer.data.corpus: {exc}") from None
    longest = max(run_controls(TrainConfig.model_validate(t)).total_tokens for t in _trial_extremes(config))
    from trainers.data import repeated_data_warning

    return repeated_data_warning(longest, available, trial.data.corpus)


def check_memory(config: SweepConfig, local: bool) -> None:
    """Every trial's estimated peak memory (``trainers.memory``: batch, sequence, model, optimizer
    state, data) must fit what it gets: ``resources.memory_mb`` where set, else (this machine's
    own Ray, ``local``) its share of this machine, the memory over the trials that run at once.
    One line naming the value and the estimate otherwise, before Ray starts."""
    from trainers.config import TrainConfig
    from trainers.corpus import TOKEN_DTYPES, token_dataset_dir, training_tokens
    from trainers.memory import estimate_train_memory, machine_memory_mb

    trial_mb = config.resources.memory_mb
    where = f"resources.memory_mb {trial_mb:,.0f} MB" if trial_mb is not None else ""
    if trial_mb is None:
        if not local:
            return  # a cluster's nodes are not this machine; resources.memory_mb says what a trial gets
        machine = machine_memory_mb()
        cpus = config.ray.num_cpus or os.cpu_count() or 1
        at_once = int(cpus // max(config.resources.cpu, 1e-9)) or 1
        if all(d.grid is not None for d in config.search_space.values()):  # a grid: no more than its trials
            at_once = min(at_once, config.num_samples * math.prod(len(d.grid or ()) for d in config.search_space.values()))
        trial_mb = machine / at_once
        where = (f"a trial's share of this machine's memory, {trial_mb:,.0f} MB ({machine:,.0f} MB over "
                 f"{at_once} trial(s) at once)")
    base = TrainConfig.model_validate(_base_trainer(config))
    try:
        data_tokens = training_tokens(base.data.model_dump())
    except Exception:  # noqa: BLE001 - check_data names a corpus problem
        data_tokens = 0
    token_bytes = 1 if token_dataset_dir(base.data.corpus) is None else TOKEN_DTYPES[base.data.token_dtype]().itemsize
    names = list(config.search_space)
    for values, trial in zip(_search_corners(config), _trial_extremes(config)):
        trainer = TrainConfig.model_validate(trial)
        estimate = estimate_train_memory(trainer, data_tokens, token_bytes)
        if estimate.total_mb > trial_mb:
            searched = ", ".join(f"{n}={int(v)}" if float(v).is_integer() else f"{n}={v:g}" for n, v in zip(names, values))
            raise ConfigError(
                f"{config.name}: trainer.batch_size: {trainer.batch_size:,} tokens a step "
                f"({trainer.micro_batch_tokens:,} a forward pass) in trial {searched}: one trial needs "
                f"{estimate.describe()}, above {where}; lower batch_size, set trainer.micro_batch_size "
                "(gradients are accumulated), or run fewer trials at once (ray.num_cpus, resources.cpu)")


#: Disk a sweep needs besides its checkpoints (MB): the MLflow store, Ray's experiment state,
#: logs and the report with its plots.
DISK_BASE_MB = 64.0
#: Checkpoints a trial keeps on disk at once: Ray's num_to_keep (2) and a rung's pause checkpoint.
CHECKPOINTS_PER_TRIAL = 3


def check_disk_space(config: SweepConfig, output: Path) -> None:
    """The output folder's filesystem must have room for the sweep's checkpoints (every trial
    keeps :data:`CHECKPOINTS_PER_TRIAL` of its weights and AdamW moments) and records: one line
    naming the folder, the space free and the space needed, before Ray starts (a full disk met
    mid-sweep was 1,177 lines of tracebacks from Ray, the state save and MLflow)."""
    import shutil

    from trainers.config import TrainConfig

    existing = next(p for p in (output, *output.parents) if p.exists())
    free_mb = shutil.disk_usage(existing).free / 2**20
    grid = all(d.grid is not None for d in config.search_space.values())
    trials = config.num_samples * (math.prod(len(d.grid or ()) for d in config.search_space.values()) if grid else 1)
    model = TrainConfig.model_validate(_base_trainer(config)).model
    checkpoint_mb = (model.n_params + model.n_embedding_params) * 12 / 2**20 + 1.0  # fp32 weights, 2 moments, history
    need_mb = DISK_BASE_MB + trials * CHECKPOINTS_PER_TRIAL * checkpoint_mb
    if free_mb < need_mb:
        raise ConfigError(f"output_dir: {output}: {free_mb:,.1f} MB free on its filesystem ({existing}), the sweep "
                          f"needs about {need_mb:,.0f} MB ({trials:,} trial(s) x {CHECKPOINTS_PER_TRIAL} checkpoints of "
                          f"{checkpoint_mb:,.1f} MB, and {DISK_BASE_MB:.0f} MB of records); free space or choose "
                          "another output_dir")


def _search_corners(config: SweepConfig) -> list[tuple[float, ...]]:
    """The searched values of each trial of :func:`_trial_extremes`, in the same order."""
    import itertools

    return list(itertools.product(*(config.search_space[n].extremes() for n in config.search_space)))


def check_device(config: SweepConfig) -> None:
    """A sweep that asks for GPUs (``resources.gpu`` > 0 or ``trainer.device: cuda``) and runs
    on this machine's own Ray needs CUDA here: one clear line instead of trials that fail."""
    wants = config.resources.gpu > 0 or config.trainer.get("device") == "cuda"
    if not wants or config.ray.address or os.environ.get("RAY_ADDRESS"):
        return
    import torch

    if not torch.cuda.is_available():
        asked = (f"resources.gpu: {config.resources.gpu:g}" if config.resources.gpu > 0
                 else "trainer.device: cuda")
        raise ConfigError(f"{config.name}: {asked} needs a CUDA GPU, but this machine has none "
                          f"(torch {torch.__version__} sees no CUDA device)")


#: Seconds a Ray cluster's address gets to accept a connection before a sweep starts
#: (ray.init would otherwise retry for minutes without a word).
RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_address(config: SweepConfig, address: Optional[str],
                      timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """An explicit Ray address (``--address``, ``ray.address`` or ``RAY_ADDRESS``) must accept a
    TCP connection within ``timeout_s``: one line naming it otherwise."""
    import socket

    field, value = next(((f, v) for f, v in (("--address", address), ("ray.address", config.ray.address),
                                             ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))) if v), (None, None))
    if not value or value in ("auto", "local"):
        return
    hostport = value.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{field}: {value!r} is not HOST:PORT (or ray://HOST:PORT, auto, local)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except socket.timeout:
        raise ConfigError(f"{field}: {value}: Ray cluster unreachable (no answer within {timeout_s:g} s)") from None
    except OSError as exc:
        raise ConfigError(f"{field}: {value}: Ray cluster unreachable ({exc.strerror or exc})") from None


def run_sweep(config: SweepConfig, address: Optional[str] = None) -> dict[str, Any]:
    """``hpo sweep``: checks, then the sweep under the output folder's lock (one driver per folder)."""
    output = preflight_sweep(config)
    check_ray_address(config, address)
    if address is None:
        check_device(config)
    warning = check_data(config)
    check_memory(config, local=not (address or config.ray.address or os.environ.get("RAY_ADDRESS")))
    check_disk_space(config, output)
    if warning:
        print(f"{warning} in the longest trial of sweep {config.name}", flush=True)
    with hold_folder(output, "hpo sweep"):
        preflight_sweep(config)  # again under the lock: another driver may have used the folder meanwhile
        return _execute(config, output, address, restore=False)


def resume_sweep(output_dir: str | Path, address: Optional[str] = None) -> dict[str, Any]:
    """``hpo resume``: checks, then the resumed sweep under the output folder's lock."""
    config, output, created_in = preflight_resume(output_dir)
    check_ray_address(config, address)
    check_disk_space(config, output)
    with hold_folder(output, "hpo resume"):
        config, output, created_in = preflight_resume(output_dir)
        return _execute(config, output, address, restore=True, created_in=created_in)
