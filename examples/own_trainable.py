"""CollapseScheduler with your own Ray Tune trainable (not collapse-hpo's trainer).

Any trainable works if every report carries the loss, the training fraction t̂ and the
run's controls (τ, TPP, schedule). Here a toy "training run" follows a power law whose level
depends on the learning rate, so the scheduler has something to rank. The toy's shape is not
a language model's, so its predicted finals are off in value (11-13% low); what the
scheduler uses, their order, is right at every rung. The trials run one at a time, best
learning rate first, so every run ends the same way: the three worse learning rates are stopped
at the first rung, t̂ = 0.1, and lr = 0.01 completes (about a third of the full compute).

    python examples/own_trainable.py
"""

from __future__ import annotations

import math
import tempfile

import ray
from ray import tune

from hpo.data import default_predictor_path
from hpo.decisions.scheduler import CollapseScheduler, SchedulerSettings
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
            "n_params": 100_000,          # non-embedding parameters N (which size the error is for)
        })


def main() -> None:
    scheduler = CollapseScheduler(
        predictor=Predictor.load(default_predictor_path()),  # the shipped predictor
        settings=SchedulerSettings(rungs=[0.1, 0.2, 0.3], reduction_factor=2, mode="async"),
        state_path=tempfile.mkdtemp() + "/scheduler_state.json",
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        my_trainable,
        # Async decides each trial against the ones that reached the rung before it, so the
        # order matters: here the trials run one at a time, in this order (the same outcome on
        # every run), the best learning rate first.
        param_space={"lr": tune.grid_search([0.01, 0.03, 0.003, 0.001])},
        # Sync mode pauses trials at each rung: a function trainable then restarts from its
        # last checkpoint, so here we use the async mode, which never pauses.
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, max_concurrent_trials=1),
        run_config=tune.RunConfig(verbose=0, storage_path=tempfile.mkdtemp()),
    )
    results = tuner.fit()
    ray.shutdown()
    finals = {r.metrics["trial_id"]: r.metrics["loss"] for r in results}
    print(scheduler.debug_string())
    for rec in sorted(scheduler.state.trials.values(), key=lambda rec: rec.order):
        pred = rec.latest_prediction or {}
        said = (f"predicted final {pred['final_loss']:.4f} ± {pred['uncertainty']:.4f} at t̂ = {pred['rung']:g}"
                if pred.get("final_loss") is not None else "no prediction")
        if rec.status == "stopped":
            print(f"lr={rec.config['lr']:g}: STOPPED at t̂ = {rec.stopped_at:g} ({said}; "
                  f"loss when stopped {finals[rec.trial_id]:.4f})")
        else:
            print(f"lr={rec.config['lr']:g}: {rec.status}, final loss {finals[rec.trial_id]:.4f} ({said})")
    print(f"compute used: {scheduler.compute_fraction():.0%} of running every trial to the end")


if __name__ == "__main__":
    main()
