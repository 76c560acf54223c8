"""The Ray Tune trainable that runs one trial of our trainer.

A class trainable (not a function) because PAUSE must continue *exactly*: Ray calls
``save_checkpoint`` at the moment the scheduler pauses a trial and ``load_checkpoint``
when it resumes, so the resumed loss sequence equals an uninterrupted run's.

Every result carries the report contract of ``docs/design.md``: the metric ``loss``
(smoothed training loss), ``train_fraction`` (t̂), and the run's controls (τ, TPP,
schedule, warmup), plus step, tokens and the raw losses.

Resuming after the driver was killed. Ray restores a trial from the last checkpoint its
experiment state *recorded*, and that state is saved only every few seconds: a trial paused
at a rung (its pause checkpoint already on disk) or one that had finished could restart from
an older checkpoint or from step 0. So the trainable itself looks on disk, in its own trial
folder, for the newest *complete* checkpoint (one whose ``progress.json`` matches its
``trainer.pt``) and continues from whichever is newer, Ray's or the one on disk. When a trial
finishes, it writes a final checkpoint before returning its last result; a finished trial
that Ray resumes anyway answers at once with that last result (``replayed``), without
training a step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from ray import tune

from hpo.trials.sweep_config import merge_trial
from predictors.io import atomic_write_json
from predictors.run_keys import KEY_TYPES, names
from trainers.config import TrainConfig
from trainers.train import CHECKPOINT_FILE, Trainer

#: Written into a checkpoint folder after ``trainer.pt``: the step, status and byte size of the
#: trainer state, so a folder whose copy was cut short by a kill is recognised as incomplete.
PROGRESS_FILE = "progress.json"
#: The folder (inside the trial folder) of the checkpoint written when a trial finishes.
FINAL_CHECKPOINT = "collapse_final"


def short_trial_dirname(trial: Any) -> str:
    """Trial folders named by id (Ray's default embeds the whole config in the name).

    ``CollapseTrainable`` finds its own folder by the ``_<trial_id>`` suffix, so keep it.
    """
    return f"{trial.trainable_name}_{trial.trial_id}"


#: The keys of every report that say which run it is (the table: predictors.run_keys).
REPORTED_KEYS = names(reported=True)


def report_controls(trainer: Trainer) -> dict[str, Any]:
    """The constant part of every report: the run's controls, flat (the keys, their order and
    types: ``predictors.run_keys``, ``reported``)."""
    config: TrainConfig = trainer.config
    controls = trainer.controls
    values = {
        "tau": controls.tau, "tokens_per_param": config.tokens_per_param, "schedule": config.schedule,
        "warmup_fraction": config.warmup_fraction, "decay_fraction": config.decay_fraction,
        "final_fraction": config.final_fraction, "decay_shape": config.decay_shape,
        "n_params": controls.n_params, "total_tokens": controls.total_tokens, "batch_size": config.batch_size,
        "eta": config.lr, "eta_hidden": controls.eta_hidden, "weight_decay": controls.weight_decay,
        "lambda_hidden": controls.lambda_hidden, "seed": config.seed, "data_seed": config.data.data_seed,
    }
    return {name: KEY_TYPES[name](values[name]) for name in REPORTED_KEYS}


def read_progress(directory: Path) -> Optional[dict[str, Any]]:
    """The ``progress.json`` of a checkpoint folder if the folder is complete, else None."""
    try:
        progress = json.loads((directory / PROGRESS_FILE).read_text())
        if (directory / CHECKPOINT_FILE).stat().st_size != int(progress["bytes"]):
            return None
        return progress
    except (OSError, ValueError, KeyError, TypeError):
        return None


class CollapseTrainable(tune.Trainable):
    """Trains one configuration, ``log_every`` optimizer steps per Tune iteration.

    The trial config holds only the searched keys (``lr``, ``batch_size``, ``tau`` or
    ``weight_decay``, ``seed``); the rest of the trainer config arrives through
    ``tune.with_parameters(CollapseTrainable, base_trainer=..., experiment_dir=...)``.
    ``experiment_dir`` (the Ray experiment folder) lets a trial find its checkpoints on disk;
    without it the trainable relies on Ray's restore alone.
    """

    def setup(self, config: dict[str, Any], base_trainer: dict[str, Any] | None = None,
              experiment_dir: str | None = None) -> None:
        self._base_trainer = dict(base_trainer or {})
        self._experiment_dir = Path(experiment_dir) if experiment_dir else None
        self._build(config)

    def _build(self, config: dict[str, Any]) -> None:
        """Build the trainer of the trial whose searched values are ``config``."""
        merged = merge_trial(self._base_trainer, config)
        # One intra-op thread per reserved CPU: more would oversubscribe the node.
        cpus = max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
        merged.setdefault("threads", cpus)
        # The sweep (or calibration) warns once about repeated data, not every trial.
        self.trainer = Trainer(TrainConfig.model_validate(merged), warn_repeats=False)
        self._controls = report_controls(self.trainer)
        self._resume_from_disk()

    # ------------------------------------------------------------------ checkpoints on disk

    def _trial_dirs(self) -> list[Path]:
        if self._experiment_dir is None or not self.trial_id or not self._experiment_dir.is_dir():
            return []
        return [d for d in self._experiment_dir.glob(f"*_{self.trial_id}") if d.is_dir()]

    def _checkpoints_on_disk(self) -> Iterator[tuple[int, Path]]:
        for trial_dir in self._trial_dirs():
            for candidate in [trial_dir / FINAL_CHECKPOINT, *trial_dir.glob("checkpoint_*")]:
                progress = read_progress(candidate)
                if progress is not None:
                    yield int(progress["step"]), candidate

    def _resume_from_disk(self) -> None:
        """Continue from the newest complete checkpoint of this trial on disk, if any."""
        for step, directory in sorted(self._checkpoints_on_disk(), key=lambda c: c[0], reverse=True):
            if step <= self.trainer.step:
                return
            try:
                self.trainer.load_checkpoint(directory)
                return
            except Exception:  # noqa: BLE001 - an unreadable one: fall back to the next older
                continue

    def _write_checkpoint(self, checkpoint_dir: str | Path) -> None:
        directory = Path(checkpoint_dir)
        path = self.trainer.save_checkpoint(directory)
        atomic_write_json(directory / PROGRESS_FILE, {
            "trial_id": self.trial_id, "step": int(self.trainer.step), "status": self.trainer.status,
            "bytes": path.stat().st_size,
        })

    # ------------------------------------------------------------------ Trainable API

    def step(self) -> dict[str, Any]:
        if self.trainer.done and self.trainer.history:
            # Finished before the driver died, but Ray did not record it: answer with the
            # last result instead of training again.
            return {**self._result(self.trainer.history[-1]), "done": True, "replayed": True}
        record = self.trainer.train_interval()
        result = self._result(record)
        if result["done"] and self._trial_dirs():
            # The final state is on disk before the last result reaches the driver, so a
            # driver killed from here on never has this trial trained again.
            self._write_checkpoint(self._trial_dirs()[0] / FINAL_CHECKPOINT)
        return result

    def _result(self, record: dict[str, Any]) -> dict[str, Any]:
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
            "done": bool(diverged or self.trainer.done),
        }
        if not math.isfinite(result["train_loss"]):
            result["train_loss"] = float("nan")
        return result

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Reuse this actor for another trial (``reuse_actors=True``): rebuild the trainer."""
        self._build(new_config)
        return True

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self._write_checkpoint(checkpoint_dir)

    def load_checkpoint(self, checkpoint: Any) -> None:
        directory = Path(checkpoint)
        progress = read_progress(directory)
        if progress is not None and int(progress["step"]) <= self.trainer.step:
            return  # already continuing from a newer checkpoint found on disk
        self.trainer.load_checkpoint(directory)
