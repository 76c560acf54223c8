"""Two real faults made with the real trainer, each beside its clean twin (issue 26) ->
benchmarks/monitor_faults.csv (the curve-import format ``hpo monitor`` reads).

    nice -n 5 python benchmarks/monitor_faults.py     # ~4 CPU-minutes on one thread

The quickstart's model and data (0.1M parameters, TPP 20, τ 0.3, linear schedule, 10% warmup).
Each twin trains uninterrupted; its faulty copy resumes from the twin's own checkpoint at
t̂ = 0.4 (the trainer's resume is exact, so the two share every step before it) and then:

* ``lr_x2_at_resume`` (η = 0.01): the resumed run's peak LR is doubled, as when a resume picks
  up a config with another batch-size/LR scaling;
* ``data_replay_at_restarts`` (η = 0.02): the job restarts at t̂ ≈ 0.4, 0.55, 0.7 and 0.85 and each
  restart re-seeds the data loader instead of restoring its state, so the stream replays its
  first batches after every restart (a loader whose position is not checkpointed).

Nothing in ``trainers/`` changes: the faults are applied to a ``Trainer`` from outside, after
``load_checkpoint``. Every resume is marked (column ``restart``), as the trainer's runner marks
them, so the monitor gives it its grace; the fault must show after that.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from hpo.data import sweep_config_path
from hpo.trials.sweep_config import load_sweep_config
from trainers.train import Trainer

OUT = Path(__file__).with_name("monitor_faults.csv")
RESUME_AT = 0.4


def base_config(lr: float) -> dict[str, Any]:
    config = dict(load_sweep_config(sweep_config_path("quickstart")).trainer)
    config.update(lr=lr, eval_every=100, threads=1, device="cpu", compile=False)
    return config


def double_lr(trainer: Trainer) -> None:
    for group in trainer.optimizer.param_groups:
        group["peak_lr"] *= 2.0


def reseed_loader(trainer: Trainer) -> None:
    trainer.sampler.generator.manual_seed(trainer.config.data.data_seed)


def train(config: dict[str, Any], restarts: tuple[float, ...] = (), fault: Callable[[Trainer], None] | None = None,
          resume_from: Path | None = None) -> list[dict[str, Any]]:
    """A run to the end; at each t̂ in ``restarts`` it is checkpointed, rebuilt, resumed and
    ``fault`` applied. With ``resume_from``: starts from that checkpoint (a restart, faulted)."""
    trainer = Trainer(config, warn_repeats=False)
    marks: set[int] = set()
    if resume_from is not None:
        trainer.load_checkpoint(resume_from)
        fault(trainer)
        marks.add(len(trainer.history))
    pending = [r for r in restarts if r > trainer.step / trainer.total_steps]
    with tempfile.TemporaryDirectory() as tmp:
        while not trainer.done:
            record = trainer.train_interval()
            if pending and record["train_fraction"] >= pending[0] and not trainer.done:
                pending.pop(0)
                trainer.save_checkpoint(tmp)
                trainer = Trainer(config, warn_repeats=False)
                trainer.load_checkpoint(tmp)
                fault(trainer)
                marks.add(len(trainer.history))
    return [{**r, "restart": int(i in marks)} for i, r in enumerate(trainer.history)]


def pair(name: str, lr: float, fault: Callable[[Trainer], None], later: tuple[float, ...]) -> list[dict[str, Any]]:
    """The clean twin (checkpointed at RESUME_AT) and its faulty copy resumed from there."""
    config = base_config(lr)
    with tempfile.TemporaryDirectory() as tmp:
        twin = Trainer(config, warn_repeats=False)
        while not twin.done:
            record = twin.train_interval()
            if abs(record["train_fraction"] - RESUME_AT) < 0.5 * config["log_every"] / twin.total_steps:
                twin.save_checkpoint(tmp)
        clean = [{**r, "restart": 0} for r in twin.history]
        faulty = train(config, later, fault, resume_from=Path(tmp))
    controls = {"tau": config["tau"], "tokens_per_param": config["tokens_per_param"],
                "n_params": twin.controls.n_params, "schedule": config["schedule"],
                "warmup_fraction": config["warmup_fraction"], "lr": lr}
    rows = []
    for run_id, history in ((f"{name}_twin", clean), (name, faulty)):
        for r in history:
            rows.append({"run_id": run_id, "train_fraction": r["train_fraction"], "loss": r["smoothed_loss"],
                         "train_loss": r["train_loss"], "val_loss": r["val_loss"],
                         "restart": r["restart"], **controls})
    return rows


def main() -> None:
    torch.set_num_threads(1)
    started = time.process_time()
    rows = pair("lr_x2_at_resume", 0.01, double_lr, ())
    rows += pair("data_replay_at_restarts", 0.02, reseed_loader, (0.55, 0.7, 0.85))
    frame = pd.DataFrame(rows)
    frame.to_csv(OUT, index=False, float_format="%.6g")
    print(f"wrote {OUT} ({len(frame)} rows, {time.process_time() - started:.0f} CPU-s)")


if __name__ == "__main__":
    main()
