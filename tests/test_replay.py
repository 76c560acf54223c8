"""Tests of ``hpo.trials.replay``: replaying banked curves through Ray Tune, and the scoring logic
of ``benchmarks/decisions.py``.

The synthetic bank: 5 runs of one τ sweep (TPP 20), each curve exactly L·ℓ̂(t̂; τ) of a
small fixed predictor, reported at t̂ = k/50. Low τ is lower early, so the curves cross:

| run | τ    | seed | final L | loss@0.1 | loss@0.2 |
|-----|------|------|---------|----------|----------|
| a   | 0.05 | 1    | 1.740   | 2.2835 (lowest) | 2.2305 |
| b   | 0.1  | 1    | 1.780   | 2.3520   | 2.2746   |
| c   | 0.4  | 1    | 1.700 (best) | 2.2928 | 2.1514 |
| c2  | 0.4  | 2    | 1.710   | 2.3063   | 2.1640   |
| d   | 0.8  | 1    | 1.705   | 2.3206   | 2.1483 (lowest) |

c and c2 are one configuration with two seeds: seed noise = std(1.70, 1.71) = 0.00707, so
d (regret 0.005) is a tie and a (regret 0.04) is not. Plus one diverged run in another sweep.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from predictors.curves import is_finished
from hpo.trials.curve_bank import append_runs, curve_frame
from hpo.trials.replay import (

    REPORT_KEYS,
    ReplayTrainable,
    bank_sweeps,
    current_best_at,
    load_replay_bank,
    outcome_from_reached,
    replay_sweep,
    run_points,
    seed_noise,
    true_finals,
)
from predictors import Controls, Predictor, SurrogateParams

PREDICTOR = Predictor(SurrogateParams(0.3, -1.1, 0.11, 0.0, m=0.14))
T_HAT = np.arange(1, 51) / 50.0  # exact at 0.1, 0.2, 0.3 and 1
RUNS = {  # name: (tau, seed, final)
    "a": (0.05, 1, 1.740),
    "b": (0.1, 1, 1.780),
    "c": (0.4, 1, 1.700),
    "c2": (0.4, 2, 1.710),
    "d": (0.8, 1, 1.705),
}
N_PARAMS, TPP, BATCH, ETA = 100_000, 20.0, 2048, 0.01
TOTAL = int(N_PARAMS * TPP)


def _run(name: str, tau: float, seed: int, final: float, sweep: str = "syn", status: str = "completed"):
    weight_decay = BATCH / (ETA * tau * TOTAL)
    run = {
        "run_id": name, "sweep": sweep, "tau": tau, "tokens_per_param": TPP, "schedule": "linear",
        "warmup_fraction": 0.1, "decay_fraction": 0.2, "n_params": N_PARAMS, "total_tokens": TOTAL,
        "batch_size": BATCH, "eta": ETA, "weight_decay": weight_decay, "d_model": 64, "n_layers": 2,
        "seq_len": 64, "seed": seed, "data_seed": 0, "corpus_hash": "x", "status": status, "config_json": "{}",
    }
    loss = final * PREDICTOR.normalized_curve(T_HAT, Controls(tau, TPP))
    if status == "diverged":
        loss = loss.copy()
        loss[30:] = np.nan
    points = [
        {"step": k + 1, "tokens": int(round(t * TOTAL)), "train_fraction": float(t),
         "train_loss": float(v) * 1.01, "smoothed_loss": float(v), "val_loss": math.nan, "lr": 0.01}
        for k, (t, v) in enumerate(zip(T_HAT, loss))
    ]
    return curve_frame(run, points)


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    path = tmp_path_factory.mktemp("bank") / "bank.parquet"
    frames = [_run(name, *spec) for name, spec in RUNS.items()]
    frames.append(_run("x", 0.2, 1, 1.9, sweep="other", status="diverged"))
    append_runs(path, frames)
    return path


# Asserts: every replayed result carries the report contract; t̂ runs through the bank's points
# and only the last point (t̂ = 1) says done.
def test_trainable_reports_contract_and_done(bank):
    trainable = ReplayTrainable(config={"run_id": "c", "bank_path": str(bank)})
    results = [trainable.train() for _ in range(len(T_HAT))]
    for key in REPORT_KEYS:
        assert key in results[0], key
    assert [r["train_fraction"] for r in results] == pytest.approx(list(T_HAT))
    assert [bool(r["done"]) for r in results] == [False] * 49 + [True]
    last = results[-1]
    assert last["loss"] == pytest.approx(1.70) and last["smoothed_loss"] == last["loss"]
    assert last["tau"] == 0.4 and last["tokens_per_param"] == TPP and last["schedule"] == "linear"
    assert last["seed"] == 1 and last["n_params"] == N_PARAMS and last["diverged"] is False
    trainable.stop()


# Asserts: a checkpoint taken mid-curve resumes at the next point, and reset_config switches the
# actor to another run from its first point.
def test_trainable_checkpoint_and_reset(bank):
    trainable = ReplayTrainable(config={"run_id": "a", "bank_path": str(bank)})
    for _ in range(5):
        trainable.train()
    state = trainable.save_checkpoint("/nonexistent")  # a dict checkpoint: the dir is unused
    assert trainable.reset_config({"run_id": "b"})
    assert trainable.step()["train_fraction"] == pytest.approx(T_HAT[0])
    assert trainable.reset_config({"run_id": "a"})
    trainable.load_checkpoint(state)
    assert trainable.step()["train_fraction"] == pytest.approx(T_HAT[5])
    with pytest.raises(ValueError):
        trainable.load_checkpoint({"run_id": "b", "next": 3})
    trainable.stop()


# Asserts: a diverged run replays its finite points and ends with diverged=True, loss NaN, done;
# grouping and finals leave it out (completed runs only).
def test_diverged_run_and_bank_views(bank):
    frame = load_replay_bank(bank)
    points = run_points(frame, "x")
    assert len(points) == 30 and points[-1]["diverged"] and math.isnan(points[-1]["loss"]) and points[-1]["done"]
    assert bank_sweeps(frame) == {"syn": ["a", "b", "c", "c2", "d"]}
    assert bank_sweeps(frame, ["tokens_per_param", "seed"]) == {
        "syn[tokens_per_param=20,seed=1]": ["a", "b", "c", "d"], "syn[tokens_per_param=20,seed=2]": ["c2"]}
    finals = true_finals(frame)
    assert finals == pytest.approx({name: spec[2] for name, spec in RUNS.items()})
    noise = seed_noise(frame, ["a", "c", "d"], finals=finals)  # c's repeat c2 counts though not listed
    assert noise.std == pytest.approx(0.01 / math.sqrt(2)) and noise.n_configs == 1 and noise.n_runs == 2
    assert seed_noise(frame, ["a", "b"], finals=finals).std is None


# Asserts: current-best@0.1 picks a (lowest at 0.1; regret 0.04, no tie) with compute
# (0.1·5 + 0.9)/5 = 0.28; at 0.2 it picks d (regret 0.005, within seed noise: a tie).
def test_current_best_at_regret_and_compute(bank):
    frame = load_replay_bank(bank)
    runs = bank_sweeps(frame)["syn"]
    noise = seed_noise(frame, runs).std
    at10 = current_best_at(frame, runs, 0.1, sweep="syn", noise=noise)
    assert (at10.method, at10.pick, at10.best) == ("current-best@0.1", "a", "c")
    assert at10.regret == pytest.approx(0.04) and at10.compute == pytest.approx(0.28)
    assert not at10.picked_best and at10.tie is False
    at20 = current_best_at(frame, runs, 0.2, noise=noise)
    assert at20.pick == "d" and at20.regret == pytest.approx(0.005) and at20.compute == pytest.approx(0.36)
    assert not at20.picked_best and at20.tie is True
    assert current_best_at(frame, runs, 0.2).tie is None  # no noise estimate, no tie verdict


# Asserts: a scheduler's pick is the finished trial with the lowest final loss, and compute is the
# mean t̂ reached; nothing finished → no pick.
def test_outcome_from_reached():
    finals = {"a": 1.74, "b": 1.78, "c": 1.70}
    o = outcome_from_reached("s", "m", {"a": 1.0, "b": 1.0, "c": 0.2}, finals)
    assert o.pick == "a" and o.regret == pytest.approx(0.04) and o.compute == pytest.approx(2.2 / 3)
    none = outcome_from_reached("s", "m", {"a": 0.3, "b": 0.3, "c": 0.1}, finals)
    assert none.pick is None and none.regret is None and not none.picked_best


# Asserts: through real Ray Tune (2 CPUs, 1 per trial), a sync CollapseScheduler with the exact
# predictor stops a, b at 0.1, c2 at 0.2, d at 0.3 and finishes only the best run c (compute 0.34,
# regret 0); every result Tune saw carried the contract keys.
def test_collapse_scheduler_on_replayed_sweep(bank, tmp_path):
    ray = pytest.importorskip("ray")
    from ray import tune

    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.decisions.scheduler_contract import SchedulerSettings
    from hpo.decisions.scheduler_state import SchedulerState

    settings = SchedulerSettings(rungs=[0.1, 0.2, 0.3], reduction_factor=2, margin=0.0, mode="sync")

    class Keys(tune.Callback):
        def __init__(self):
            self.missing: set[str] = set()
            self.n = 0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.n += 1
            self.missing |= {k for k in REPORT_KEYS if k not in result}

    started = time.monotonic()
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.monotonic() - started:.1f} s")
    keys = Keys()
    state_path = tmp_path / "state.json"
    try:
        scheduler = CollapseScheduler(predictor=PREDICTOR, settings=settings, state_path=state_path)
        frame = load_replay_bank(bank)
        runs = bank_sweeps(frame)["syn"]
        reached, errors = replay_sweep(bank, runs, scheduler, name="syn", storage_path=tmp_path / "ray",
                                       callbacks=[keys])
    finally:
        if own_ray:
            ray.shutdown()
    print(f"replayed sweep: {time.monotonic() - started:.1f} s")
    assert errors == []
    assert reached == pytest.approx({"a": 0.1, "b": 0.1, "c": 1.0, "c2": 0.2, "d": 0.3})
    state = SchedulerState.load(state_path)
    got = {rec.config["run_id"]: (rec.status, rec.stopped_at) for rec in state.trials.values()}
    assert got == {"a": ("stopped", 0.1), "b": ("stopped", 0.1), "c2": ("stopped", 0.2),
                   "d": ("stopped", 0.3), "c": ("completed", None)}
    assert keys.n > 0 and keys.missing == set()
    o = outcome_from_reached("syn", "collapse", reached, true_finals(frame), seed_noise(frame, runs).std)
    assert o.pick == "c" and o.picked_best and o.regret == 0.0 and o.tie is True
    assert o.compute == pytest.approx(0.34) and is_finished(reached["c"])
    # The offline simulator (what the decision benchmark runs) makes the same decisions on the
    # same curves: same keep set at every rung, same t̂ reached.
    from hpo.trials.simulator import SimulatedSweep

    offline = CollapseScheduler(predictor=PREDICTOR, settings=settings)
    simulated = SimulatedSweep(offline, {r: run_points(frame, r) for r in runs}).run()
    assert simulated.reached == pytest.approx(reached)
    by_run = {tid: rec.config["run_id"] for tid, rec in state.trials.items()}
    assert [sorted(by_run[t] for t in rung.survivors) for rung in state.rungs] == \
        [sorted(rung.survivors) for rung in offline.state.rungs]
