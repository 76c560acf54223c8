"""CollapseTrainable resumes from the newest complete checkpoint on disk and never trains a
finished trial again (what a driver killed before Ray saved its experiment state needs).

The trainable runs in-process here (outside Tune its trial id is ``default``), writing the
folders Ray would write: ``<experiment>/<Trainable>_<trial id>/checkpoint_NNNNNN``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpo.trials.trainable import FINAL_CHECKPOINT, CollapseTrainable

BASE: dict[str, Any] = {
    "model": {"d_model": 32, "n_layers": 1, "d_head": 16, "seq_len": 32, "base_d_model": 32, "base_n_layers": 1},
    "tokens_per_param": 1, "batch_size": 512, "lr": 0.01, "tau": 0.3, "log_every": 4,
    "eval_every": None, "eval_tokens": 2048, "threads": 1,
}


def _trainable(experiment: Path) -> CollapseTrainable:
    class Local(CollapseTrainable):
        def setup(self, config: dict[str, Any]) -> None:  # what tune.with_parameters does
            super().setup(config, base_trainer=BASE, experiment_dir=str(experiment))

    return Local(config={"lr": 0.01})


def test_a_new_actor_continues_from_the_checkpoint_on_disk(tmp_path: Path) -> None:
    # Ray recorded no checkpoint (its experiment state was older), but the pause checkpoint is
    # on disk: the next actor of the trial starts from it, not from step 0, and goes on with
    # exactly the losses an uninterrupted run has.
    experiment = tmp_path / "ray" / "sweep"
    trial_dir = experiment / "CollapseTrainable_default"
    first = _trainable(experiment)
    first.step(), first.step()
    first.save_checkpoint(str(trial_dir / "checkpoint_000000"))
    saved = first.trainer.step
    expected = first.step()
    assert not first.trainer.done

    second = _trainable(experiment)
    assert second.trainer.step == saved > 0
    assert second.step()["train_loss"] == expected["train_loss"]


def test_an_incomplete_checkpoint_is_skipped(tmp_path: Path) -> None:
    # A checkpoint whose trainer.pt was cut short (its size differs from progress.json) is not
    # used; the trial falls back to the older complete one.
    experiment = tmp_path / "ray" / "sweep"
    trial_dir = experiment / "CollapseTrainable_default"
    first = _trainable(experiment)
    first.step()
    first.save_checkpoint(str(trial_dir / "checkpoint_000000"))
    older = first.trainer.step
    first.step()
    first.save_checkpoint(str(trial_dir / "checkpoint_000001"))
    broken = trial_dir / "checkpoint_000001" / "trainer.pt"
    broken.write_bytes(broken.read_bytes()[:100])
    assert _trainable(experiment).trainer.step == older


def test_ray_restoring_an_older_checkpoint_keeps_the_newer_state(tmp_path: Path) -> None:
    # Ray's restore hands over the checkpoint it recorded; when the trainable already holds a
    # newer one from disk, it keeps the newer one.
    experiment = tmp_path / "ray" / "sweep"
    trial_dir = experiment / "CollapseTrainable_default"
    first = _trainable(experiment)
    first.step()
    first.save_checkpoint(str(trial_dir / "checkpoint_000000"))
    first.step()
    first.save_checkpoint(str(trial_dir / "checkpoint_000001"))
    newer = first.trainer.step
    second = _trainable(experiment)
    second.load_checkpoint(str(trial_dir / "checkpoint_000000"))
    assert second.trainer.step == newer


def test_a_finished_trial_answers_with_its_last_result_without_training(tmp_path: Path) -> None:
    # The last result of a trial writes a final checkpoint first; a trial Ray resumes after it
    # finished returns that last result at once (done, flagged replayed) and trains nothing.
    experiment = tmp_path / "ray" / "sweep"
    (experiment / "CollapseTrainable_default").mkdir(parents=True)
    first = _trainable(experiment)
    result: dict[str, Any] = {"done": False}
    while not result["done"]:
        result = first.step()
    assert (experiment / "CollapseTrainable_default" / FINAL_CHECKPOINT / "trainer.pt").exists()

    again = _trainable(experiment)
    steps = again.trainer.step
    replayed = again.step()
    assert replayed["done"] and replayed["replayed"] and again.trainer.step == steps
    assert replayed["train_fraction"] == pytest.approx(1.0)
    assert replayed["loss"] == result["loss"]
