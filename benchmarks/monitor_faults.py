"""Real faults made with the real trainer, each beside its clean twin ->
benchmarks/monitor_faults.csv (the curve-import format ``hpo monitor`` reads).

    nice -n 5 python benchmarks/monitor_faults.py                # all, ~7 CPU-minutes on one thread
    nice -n 5 python benchmarks/monitor_faults.py --only bf16    # the faults whose name starts so

The quickstart's model and data (0.1M parameters, TPP 20, τ 0.3, linear schedule, 10% warmup).
Each twin trains uninterrupted; its faulty copy resumes from the twin's own checkpoint at
t̂ = 0.4 (the trainer's resume is exact, so the two share every step before it) and then:

* ``lr_x2_at_resume`` (η = 0.01): the resumed run's peak LR is doubled, as when a resume picks
  up a config with another batch-size/LR scaling;
* ``data_replay_at_restarts`` (η = 0.02): the job restarts at t̂ ≈ 0.4, 0.55, 0.7 and 0.85 and each
  restart re-seeds the data loader instead of restoring its state, so the stream replays its
  first batches after every restart (a loader whose position is not checkpointed).
* ``bf16_weights_at_resume`` (η = 0.01), at 0.1M and at 24K parameters (d_model 32): a numerical
  fault, the paper's kind: from the resume on, the weights are kept in bfloat16 (every parameter
  rounded to bf16 after each optimizer step, as when the fp32 master copy is lost). Updates
  smaller than half a bf16 ulp vanish, more of them as the LR decays, so the loss falls more
  slowly than its twin's: no spike, a slow drift.

Nothing in ``trainers/`` changes: the faults are applied to a ``Trainer`` from outside, after
``load_checkpoint``. Every resume is marked (column ``restart``), as the trainer's runner marks
them, so the monitor gives it its grace; the fault must show after that.
"""

from __future__ import annotations

import argparse
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


#: The width ladder's smallest model (24K parameters; configs/calibration/width_ladder.yaml).
SMALL_MODEL = {"d_model": 32, "n_layers": 2, "d_head": 32, "seq_len": 64, "base_d_model": 64, "base_n_layers": 2}


def base_config(lr: float, model: dict[str, Any] | None = None) -> dict[str, Any]:
    config = dict(load_sweep_config(sweep_config_path("quickstart")).trainer)
    config.update(lr=lr, eval_every=100, threads=1, device="cpu", compile=False)
    if model is not None:
        config["model"] = dict(model)
    return config


def double_lr(trainer: Trainer) -> None:
    for group in trainer.optimizer.param_groups:
        group["peak_lr"] *= 2.0


def reseed_loader(trainer: Trainer) -> None:
    trainer.sampler.generator.manual_seed(trainer.config.data.data_seed)


def bf16_weights(trainer: Trainer) -> None:
    """From now on every parameter is rounded to bfloat16 after each optimizer step."""
    params = [p for group in trainer.optimizer.param_groups for p in group["params"]]

    @torch.no_grad()
    def round_to_bf16(*_: Any) -> None:
        for p in params:
            p.copy_(p.to(torch.bfloat16).to(p.dtype))

    trainer.optimizer.register_step_post_hook(round_to_bf16)


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


def pair(name: str, lr: float, fault: Callable[[Trainer], None], later: tuple[float, ...],
         model: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The clean twin (checkpointed at RESUME_AT) and its faulty copy resumed from there."""
    config = base_config(lr, model)
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


#: name -> (peak LR, fault, later restarts, model or None for the quickstart's).
FAULTS: dict[str, tuple[float, Callable[[Trainer], None], tuple[float, ...], dict[str, Any] | None]] = {
    "lr_x2_at_resume": (0.01, double_lr, (), None),
    "data_replay_at_restarts": (0.02, reseed_loader, (0.55, 0.7, 0.85), None),
    "bf16_weights_at_resume": (0.01, bf16_weights, (), None),
    "bf16_weights_at_resume_24k": (0.01, bf16_weights, (), SMALL_MODEL),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="train only the faults whose name starts with this; "
                                                   "their rows replace theirs in the existing CSV")
    args = parser.parse_args()
    chosen = [name for name in FAULTS if name.startswith(args.only)]
    if not chosen:
        parser.error(f"--only {args.only!r}: no fault of that name (known: {', '.join(FAULTS)})")
    torch.set_num_threads(1)
    started = time.process_time()
    rows = []
    for name in chosen:
        lr, fault, later, model = FAULTS[name]
        rows += pair(name, lr, fault, later, model)
    frame = pd.DataFrame(rows)
    if args.only and OUT.exists():
        old = pd.read_csv(OUT)
        frame = pd.concat([old[~old["run_id"].isin(set(frame["run_id"]))], frame], ignore_index=True)
    frame.to_csv(OUT, index=False, float_format="%.6g")
    print(f"wrote {OUT} ({len(frame)} rows, {time.process_time() - started:.0f} CPU-s)")


if __name__ == "__main__":
    main()
