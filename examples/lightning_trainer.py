"""CollapseScheduler with a Lightning module: the callback reports what it needs.

A learning-rate sweep of a tiny randomly initialised language model (an embedding, one MLP
block, an output projection) on synthetic token sequences (each an arithmetic progression
modulo the vocabulary), on CPU, no download. Each trial is an ordinary ``lightning.Trainer``
with AdamW and a linear warmup then linear decay (``SequentialLR``); ``CollapseReportCallback``
derives τ, TPP, the schedule and N from the trainer, the optimizer and the first batch, and
reports the mean training loss of every step to Ray Tune. The model is far smaller than
anything the shipped predictor was calibrated on, so its predicted finals are rough; what the
demo shows is the wiring: every rung decided, the losing learning rates stopped early.

    pip install -e ".[lightning]" && python examples/lightning_trainer.py
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

STEPS, WARMUP, SEQ_LEN, VOCAB, BATCH = 60, 6, 32, 64, 8
LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2)


def train(config: dict[str, Any]) -> None:
    """One trial: an ordinary Lightning fit with the reporting callback."""
    import lightning.pytorch as pl
    import torch

    from hpo.integrations.lightning import CollapseReportCallback

    class TinyLM(pl.LightningModule):
        def __init__(self, lr: float, width: int = 32) -> None:
            super().__init__()
            self.lr = lr
            self.embed = torch.nn.Embedding(VOCAB, width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))
            self.lm_head = torch.nn.Linear(width, VOCAB, bias=False)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            ids = batch[0]
            hidden = self.embed(ids[:, :-1])
            logits = self.lm_head(hidden + self.mlp(hidden))
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

        def configure_optimizers(self) -> dict[str, Any]:
            opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1.0)
            warmup = torch.optim.lr_scheduler.LinearLR(opt, 1e-3, 1.0, total_iters=WARMUP)
            decay = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=STEPS - WARMUP)
            schedule = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[WARMUP])
            return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n = STEPS * BATCH
    ids = (torch.randint(0, VOCAB, (n, 1), generator=g)
           + torch.randint(1, 4, (n, 1), generator=g) * torch.arange(SEQ_LEN)) % VOCAB
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)
    trainer = pl.Trainer(max_steps=STEPS, log_every_n_steps=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[CollapseReportCallback()])
    trainer.fit(TinyLM(config["lr"]), data)


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
