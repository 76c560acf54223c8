"""The Ray Tune trainable that runs one trial of our trainer.

A class trainable (not a function) because PAUSE must continue *exactly*: Ray calls
``save_checkpoint`` at the moment the scheduler pauses a trial and ``load_checkpoint``
when it resumes, so the resumed loss sequence equals an uninterrupted run's.

Every result carries the report contract of ``docs/design.md``: the metric ``loss``
(smoothed training loss), ``train_fraction`` (t̂), and the run's controls (τ, TPP,
schedule, warmup), plus step, tokens and the raw losses.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ray import tune

from hpo.sweep_config import merge_trial
from trainers.config import TrainConfig
from trainers.train import Trainer


def short_trial_dirname(trial: Any) -> str:
    """Trial folders named by id (Ray's default embeds the whole config in the name)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def report_controls(trainer: Trainer) -> dict[str, Any]:
    """The constant part of every report: the run's controls, flat."""
    config: TrainConfig = trainer.config
    controls = trainer.controls
    return {
        "tau": float(controls.tau),
        "tokens_per_param": float(config.tokens_per_param),
        "schedule": str(config.schedule),
        "warmup_fraction": float(config.warmup_fraction),
        "decay_fraction": float(config.decay_fraction),
        "n_params": int(controls.n_params),
        "total_tokens": int(controls.total_tokens),
        "batch_size": int(config.batch_size),
        "eta": float(config.lr),
        "eta_hidden": float(controls.eta_hidden),
        "weight_decay": float(controls.weight_decay),
        "lambda_hidden": float(controls.lambda_hidden),
        "seed": int(config.seed),
        "data_seed": int(config.data.data_seed),
    }


class CollapseTrainable(tune.Trainable):
    """Trains one configuration, ``log_every`` optimizer steps per Tune iteration.

    The trial config holds only the searched keys (``lr``, ``batch_size``, ``tau`` or
    ``weight_decay``, ``seed``); the rest of the trainer config arrives through
    ``tune.with_parameters(CollapseTrainable, base_trainer=...)``.
    """

    def setup(self, config: dict[str, Any], base_trainer: dict[str, Any] | None = None) -> None:
        self._base_trainer = dict(base_trainer or {})
        self._build(config)

    def _build(self, config: dict[str, Any]) -> None:
        """Build the trainer of the trial whose searched values are ``config``."""
        merged = merge_trial(self._base_trainer, config)
        # One intra-op thread per reserved CPU: more would oversubscribe the node.
        cpus = max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
        merged.setdefault("threads", cpus)
        self.trainer = Trainer(TrainConfig.model_validate(merged))
        self._controls = report_controls(self.trainer)

    def step(self) -> dict[str, Any]:
        record = self.trainer.train_interval()
        diverged = self.trainer.status == "diverged"
        smoothed = float(record.get("smoothed_loss", float("nan")))
        result = {
            **self._controls,
            "loss": smoothed if not diverged else float("nan"),
            "smoothed_loss": smoothed,
            "train_loss": float(record["train_loss"]),
            "val_loss": float(record.get("val_loss", float("nan"))),
            "lr": float(record["lr"]),
            "step": int(record["step"]),
            "tokens": int(record["tokens"]),
            "train_fraction": float(record["train_fraction"]),
            "diverged": diverged,
            "status": self.trainer.status,
        }
        if diverged or self.trainer.done:
            result["done"] = True
        if not math.isfinite(result["train_loss"]):
            result["train_loss"] = float("nan")
        return result

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Reuse this actor for another trial (``reuse_actors=True``): rebuild the trainer."""
        self._build(new_config)
        return True

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.trainer.save_checkpoint(checkpoint_dir)

    def load_checkpoint(self, checkpoint: Any) -> None:
        self.trainer.load_checkpoint(checkpoint)
