"""The sweep's searcher: Optuna's TPE told the predicted final loss of every trial the scheduler
stopped (not the loss at the stop), end to end through Ray Tune."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from hpo.decisions.scheduler_records import TrialRecord, TrialStatus
from hpo.trials.search import PredictedFinalSearcher, build_search_alg, recorded_trials, stopped_prediction
from hpo.trials.sweep_config import SearchSettings, load_sweep_config
from sweep_fixtures import tiny_sweep


class _Recorder:
    """A stand-in searcher that records what it is told."""

    metric = "loss"

    def __init__(self) -> None:
        self.completed: dict[str, Any] = {}

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        self.completed[trial_id] = (result, error)


def _scheduler(**records: TrialRecord) -> Any:
    return SimpleNamespace(state=SimpleNamespace(trials=records))


def test_a_stopped_trial_reaches_the_searcher_with_its_predicted_final() -> None:
    stopped = TrialRecord("a", status=TrialStatus.STOPPED, stopped_at=0.2,
                          latest_prediction={"rung": 0.2, "final_loss": 3.1, "uncertainty": 0.05})
    paused_stop = TrialRecord("b", status=TrialStatus.STOPPED, stopped_at=0.2,
                              latest_prediction={"rung": 0.2, "final_loss": 3.4, "uncertainty": 0.05})
    finished = TrialRecord("c", status=TrialStatus.COMPLETED, final_metric=2.9,
                           latest_prediction={"rung": 0.4, "final_loss": 2.8, "uncertainty": 0.05})
    inner = _Recorder()
    searcher = PredictedFinalSearcher(inner, stopped_prediction(_scheduler(a=stopped, b=paused_stop, c=finished)),
                                      metric="loss")
    searcher.on_trial_complete("a", {"loss": 4.0, "train_fraction": 0.2})  # RUNNING, stopped on its result
    searcher.on_trial_complete("b")  # PAUSED at a sync rung: Ray passes no result at all
    searcher.on_trial_complete("c", {"loss": 2.9})
    assert inner.completed["a"] == ({"loss": 3.1, "train_fraction": 0.2}, False)
    assert inner.completed["b"] == ({"loss": 3.4}, False)
    assert inner.completed["c"] == ({"loss": 2.9}, False)  # a finished trial keeps its own final
    assert searcher.replaced == {"a": (4.0, 3.1), "b": (None, 3.4)}


def test_an_errored_trial_is_passed_on_as_an_error() -> None:
    rec = TrialRecord("a", status=TrialStatus.STOPPED, latest_prediction={"final_loss": 3.1})
    inner = _Recorder()
    PredictedFinalSearcher(inner, stopped_prediction(_scheduler(a=rec)), "loss").on_trial_complete("a", error=True)
    assert inner.completed["a"] == (None, True)


def test_random_search_stays_the_default_and_grid_spaces_keep_working(tmp_path: Path) -> None:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    config = load_sweep_config(data=tiny_sweep(tmp_path))
    assert config.search == SearchSettings()
    assert isinstance(build_search_alg(config.search, lambda _: None), BasicVariantGenerator)


def test_the_packaged_search_sweep_searches_lr_and_batch_at_fixed_tau() -> None:
    from hpo.data import packaged_sweep

    config = load_sweep_config(packaged_sweep("search"))
    assert config.search.algorithm == "optuna" and set(config.search_space) == {"lr", "batch_size"}
    assert "tau" in config.trainer and "weight_decay" not in config.trainer  # λ derived per trial


@pytest.fixture(scope="module")
def optuna_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four trials suggested by TPE two at a time (sync rungs at 0.2 and 0.4, margin 0): each
    pair's first rung stops one trial, so the later suggestions follow predicted finals."""
    import ray

    from hpo.service.sweep import run_sweep

    output = tmp_path_factory.mktemp("search") / "out"
    data = tiny_sweep(output)
    data.update(search_space={"lr": {"loguniform": [0.0025, 0.16]}}, num_samples=4,
                search={"algorithm": "optuna", "seed": 0, "max_concurrent": 2})
    try:
        outcome = run_sweep(load_sweep_config(data=data))
    finally:
        ray.shutdown()
    assert outcome["errors"] == []
    return output


def _study(output: Path) -> tuple[Any, dict[str, Any]]:
    """Optuna's study and Ray trial id -> Optuna trial, from the searcher state Ray saved."""
    # One file per driver session (a resume adds one): the newest is the searcher's state.
    path = max((output / "ray" / "tiny").glob("searcher-state-*.pkl"), key=lambda p: p.stat().st_mtime)
    state = pickle.loads(path.read_bytes())
    return state["_ot_study"], state["_ot_trials"]


def test_an_optuna_sweep_tells_tpe_the_predicted_finals_of_its_stopped_trials(optuna_sweep: Path) -> None:
    from hpo.decisions.scheduler_state import SchedulerState

    trials = SchedulerState.load(optuna_sweep / "scheduler_state.json").trials
    assert len(trials) == 4
    stopped = {tid: t for tid, t in trials.items() if t.status == TrialStatus.STOPPED}
    completed = {tid: t for tid, t in trials.items() if t.status == TrialStatus.COMPLETED}
    assert stopped and completed and len(stopped) + len(completed) == 4
    study, ot_trials = _study(optuna_sweep)
    told = {tid: study.trials[ot.number] for tid, ot in ot_trials.items()}
    assert set(told) == set(trials)
    for tid, rec in stopped.items():
        assert told[tid].state.name == "COMPLETE"
        assert told[tid].value == pytest.approx(rec.latest_prediction["final_loss"])
        assert told[tid].value != pytest.approx(rec.history[-1][1])  # not the loss at the stop
    for tid, rec in completed.items():
        assert told[tid].value == pytest.approx(rec.final_metric)
    # Every trial ran the config Optuna suggested for it.
    for tid, rec in trials.items():
        assert rec.config["lr"] == pytest.approx(told[tid].params["lr"])


def _ray_experiment_state(experiment: Path, trials: list[tuple[str, float, str]]) -> None:
    """An experiment state file as Ray Tune writes it, reduced to what a rebuild reads."""
    import json

    experiment.mkdir(parents=True)
    data = [[json.dumps({"trial_id": tid, "evaluated_params": {"lr": lr}, "status": status}), "{}"]
            for tid, lr, status in trials]
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))


def test_a_searcher_without_saved_state_is_rebuilt_from_the_recorded_trials(tmp_path: Path) -> None:
    """No searcher state saved with the experiment: TPE is told every ended trial (a stopped
    one its predicted final), the trial Ray resumes is registered as running and its result
    reaches TPE, the counter starts at the trials already created, and the first suggestion is
    not the first sweep's first suggestion again (the same seed would repeat it)."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from hpo.trials.search import RebuiltSearchGenerator, resume_search_alg

    settings = SearchSettings(algorithm="optuna", seed=0, max_concurrent=2)
    space = {"lr": tune.loguniform(0.0025, 0.16)}
    fresh = build_search_alg(settings, lambda _: None, 2)
    fresh.set_search_properties("loss", "min", space)
    first_lr = fresh.suggest("first")["lr"]  # what the first sweep ran first
    experiment = tmp_path / "ray" / "tiny"
    _ray_experiment_state(experiment, [("a", first_lr, "TERMINATED"), ("b", 0.05, "TERMINATED"),
                                       ("c", 0.01, "RUNNING")])
    records = {"a": TrialRecord("a", status=TrialStatus.COMPLETED, final_metric=2.0, history=[[1.0, 2.0]]),
               "b": TrialRecord("b", status=TrialStatus.STOPPED, history=[[0.2, 3.0]],
                                latest_prediction={"final_loss": 2.5}),
               "c": TrialRecord("c", status=TrialStatus.RUNNING, history=[[0.2, 2.9]])}
    alg, line = resume_search_alg(settings, stopped_prediction(_scheduler(**records)), experiment, records, 4, 2,
                                  lambda: tune.Experiment("tiny", lambda config: None, num_samples=4))
    assert isinstance(alg, RebuiltSearchGenerator)
    assert line.startswith("search: Optuna TPE rebuilt from the recorded results")
    assert "2 trials told (1 stopped ones with their predicted finals" in line and "3 of 4 suggested" in line
    alg.set_search_properties("loss", "min", space)
    base = alg.searcher.searcher.searcher
    assert isinstance(base, OptunaSearch)
    by_lr = {round(t.params["lr"], 12): t for t in base._ot_study.trials}
    assert by_lr[round(first_lr, 12)].value == pytest.approx(2.0)
    assert by_lr[round(0.05, 12)].value == pytest.approx(2.5)  # the predicted final, not 3.0 at the stop
    assert by_lr[round(0.01, 12)].state.name == "RUNNING"
    trial = alg.next_trial()  # one slot free: c resumes in the other
    assert trial is not None and trial.config["lr"] != pytest.approx(first_lr)
    assert alg.next_trial() is None and alg.is_finished()  # 4 of num_samples 4
    alg.on_trial_complete("c", {"loss": 1.9})
    resumed = base._ot_study.trials[by_lr[round(0.01, 12)].number]  # (study.trials are copies)
    assert resumed.state.name == "COMPLETE" and resumed.value == pytest.approx(1.9)


REPO = Path(__file__).resolve().parents[1]


def _told(output: Path) -> list[Any]:
    """The trials Optuna has been told (finished) in the searcher state Ray saved, if any."""
    try:
        study, _ = _study(output)
    except (ValueError, OSError, EOFError, pickle.UnpicklingError, KeyError):
        return []  # not saved yet, or being replaced as we read
    return [t for t in study.trials if t.state.is_finished()]


# The rebuild's own behaviour is tested above without a cluster; the killed and resumed search
# sweeps end to end (~1 min each on 2 cores, the default suite's slowest) run with the slow tests
# in .ci/run.
@pytest.mark.slow
@pytest.mark.parametrize("searcher_state", ["saved", "lost"])
def test_a_resumed_search_sweep_restores_or_rebuilds_tpe_and_repeats_no_finished_configuration(
        searcher_state: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kill the driver once TPE has been told a trial, resume: the searcher comes back from the
    state Ray saved, or, with that state removed, is rebuilt from the recorded trials (a fresh
    one, seeded the same, would suggest the same first learning rates again); every trial is
    accounted for, num_samples counts across the resume, and no finished configuration runs twice."""
    import ray
    import yaml

    from hpo.decisions.scheduler_state import SchedulerState
    from hpo.service.sweep import resume_sweep

    output = tmp_path / "out"
    data = tiny_sweep(output, mode="async")
    # Six trials, two at a time: the kill after the first told trial comes before the last is suggested.
    data.update(search_space={"lr": {"loguniform": [0.0025, 0.16]}}, num_samples=6,
                search={"algorithm": "optuna", "seed": 0, "max_concurrent": 2})
    config_path = tmp_path / "s.yaml"
    config_path.write_text(yaml.safe_dump(data))
    # Ray snapshots the experiment (and the searcher) every 10 s by default: on a fast machine all
    # six trials were created before the first snapshot that held a told one. Every second, the
    # kill lands soon after the first tell.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TUNE_GLOBAL_CHECKPOINT_S": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-m", "hpo.service.cli", "sweep", str(config_path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not _told(output):
            assert driver.poll() is None, "sweep ended before the searcher was told a trial"
            assert time.time() < deadline, "no trial told to the searcher in time"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    told_before = {t.params["lr"] for t in _told(output)}
    before = SchedulerState.load(output / "scheduler_state.json").trials
    ended_before = {tid: rec.config["lr"] for tid, rec in before.items() if not rec.alive}
    # What the resume keeps is Ray's last snapshot, not the scheduler state (written on its own
    # clock: either may hold trials the other does not yet).
    experiment = output / "ray" / "tiny"
    kept = {t.trial_id: t.params["lr"] for t in recorded_trials(experiment, {})}
    assert len(kept) < 6, f"the kill came after Ray had created every trial ({kept}): nothing left to suggest"
    assert len(before) < 6  # nor had the scheduler been told of every trial
    if searcher_state == "lost":
        for saved in [*experiment.glob("searcher-state-*.pkl"), *experiment.glob("search_gen_state-*.json")]:
            saved.unlink()

    try:
        outcome = resume_sweep(output)
    finally:
        ray.shutdown()
    assert outcome["errors"] == [] and not outcome["interrupted"]
    printed = capsys.readouterr().out
    if searcher_state == "saved":
        assert "search: Optuna TPE restored from the state saved with the experiment (not rebuilt)" in printed
    else:
        assert "search: Optuna TPE rebuilt from the recorded results" in printed
        assert " of 6 suggested" in printed
    after = SchedulerState.load(output / "scheduler_state.json").trials
    assert len(after) == 6 and all(not rec.alive for rec in after.values()), printed  # none lost, num_samples in all
    assert set(ended_before) | set(kept) <= set(after)  # the trials ended or kept before the kill, not run again
    lrs = sorted(rec.config["lr"] for rec in after.values())
    assert all(b != pytest.approx(a) for a, b in zip(lrs, lrs[1:])), lrs  # no configuration ran twice
    new = [rec.config["lr"] for tid, rec in after.items() if tid not in kept and tid not in before]
    old = told_before | set(ended_before.values()) | set(kept.values())
    assert new and not any(lr == pytest.approx(o) for lr in new for o in old)  # suggested after the resume
