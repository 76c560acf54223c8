"""CollapseScheduler with a Hugging Face ``Trainer``: the callback reports what it needs.

A learning-rate sweep of a tiny randomly initialised GPT-2 (2 layers, width 32) on synthetic
token sequences (each an arithmetic progression modulo the vocabulary, so there is something
to learn), on CPU, no download. Each trial is an ordinary ``Trainer``;
``CollapseReportCallback`` derives τ, TPP, the schedule and N from its ``TrainingArguments``
and the model, and reports each logged loss to Ray Tune. The trials are far smaller than
anything the shipped predictor was calibrated on, so its predicted finals are rough; what the
demo shows is the wiring: every rung decided, the losing learning rates stopped early.

    pip install -e ".[hf]" && python examples/hf_trainer.py
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import ray
from ray import tune

from hpo.data import default_predictor_path
from hpo.decisions.scheduler import CollapseScheduler, SchedulerSettings
from predictors import Predictor

STEPS, SEQ_LEN, VOCAB = 60, 32, 64
LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2)


def tokens(n: int, seed: int = 0) -> Any:
    """``n`` sequences of ``SEQ_LEN`` tokens, each an arithmetic progression modulo ``VOCAB``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    ids = (start + stride * torch.arange(SEQ_LEN)) % VOCAB
    return [{"input_ids": row, "labels": row} for row in ids]


def train(config: dict[str, Any]) -> None:
    """One trial: an ordinary Trainer with the reporting callback."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    from hpo.integrations.hf import CollapseReportCallback

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), max_steps=STEPS, per_device_train_batch_size=8, learning_rate=config["lr"],
        weight_decay=1.0, warmup_steps=0.1, lr_scheduler_type="cosine", logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=tokens(STEPS * 8), callbacks=[CollapseReportCallback()]).train()


def main(state_dir: str | None = None) -> CollapseScheduler:
    """Run the sweep; the scheduler (its state holds every rung's decision)."""
    logging.getLogger("hpo.decisions.scheduler").setLevel(logging.ERROR)  # far-off-calibration warnings
    state_dir = state_dir or tempfile.mkdtemp()
    scheduler = CollapseScheduler(predictor=Predictor.load(default_predictor_path()),
                                  settings=SchedulerSettings(rungs=[0.1, 0.2, 0.3], reduction_factor=2, mode="async"),
                                  state_path=os.path.join(state_dir, "scheduler_state.json"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tune.Tuner(train, param_space={"lr": tune.grid_search(list(LEARNING_RATES))},
                   tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler),
                   run_config=tune.RunConfig(verbose=0, storage_path=os.path.join(state_dir, "ray"))).fit()
    finally:
        ray.shutdown()
    return scheduler


if __name__ == "__main__":
    done = main()
    print(done.debug_string())
    for rec in sorted(done.state.trials.values(), key=lambda rec: rec.order):
        print(f"lr={rec.config['lr']:g}: " + (f"stopped at t̂ = {rec.stopped_at:g}" if rec.status == "stopped" else rec.status))
    print(f"compute used: {done.compute_fraction():.0%} of running every trial to the end")
