"""CollapseScheduler with your own Ray Tune trainable (not collapse-hpo's trainer).

Any trainable works if every report carries the loss, the training fraction t̂ and the
run's controls (τ, TPP, schedule). Here a toy "training run" follows a power law whose level
depends on the learning rate, so the scheduler has something to rank.

    python examples/own_trainable.py
"""

from __future__ import annotations

import math
import tempfile

import ray
from ray import tune

from hpo.data import default_predictor_path
from hpo.scheduler import CollapseScheduler
from predictors import Predictor

TOTAL_STEPS = 200


def my_trainable(config: dict) -> None:
    for step in range(1, TOTAL_STEPS + 1):
        t_hat = step / TOTAL_STEPS
        loss = (1.5 + 10 * (math.log10(config["lr"]) + 2) ** 2 / 100) * (1 + 0.3 * t_hat ** -0.3)
        tune.report({
            "loss": loss,                 # the metric (a smoothed training loss)
            "train_fraction": t_hat,      # the time axis: tokens seen / total tokens
            "tau": 0.3,                   # AdamW timescale B/(η·λ·D) of this run
            "tokens_per_param": 20.0,     # D/N
            "schedule": "linear",         # warmup then linear decay to zero
            "warmup_fraction": 0.1,
        })


def main() -> None:
    scheduler = CollapseScheduler(
        predictor=Predictor.load(default_predictor_path()),  # the shipped predictor
        rungs=(0.1, 0.2, 0.3),
        reduction_factor=2,
        decision_mode="async",
        state_path=tempfile.mkdtemp() + "/scheduler_state.json",
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        my_trainable,
        param_space={"lr": tune.grid_search([0.001, 0.003, 0.01, 0.03])},
        # Sync mode pauses trials at each rung: a function trainable then restarts from its
        # last checkpoint, so here we use the async mode, which never pauses.
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler),
        run_config=tune.RunConfig(verbose=0, storage_path=tempfile.mkdtemp()),
    )
    tuner.fit()
    print(scheduler.debug_string())
    ray.shutdown()


if __name__ == "__main__":
    main()
