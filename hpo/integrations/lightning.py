"""Report a Lightning run to Ray Tune as ``CollapseScheduler`` reads it.

``pip install -e ".[lightning]"``; then, inside a Ray Tune trainable::

    trainer = lightning.Trainer(max_steps=..., callbacks=[CollapseReportCallback()])
    trainer.fit(module, dataloader)

When training starts the callback derives the run's controls from the trainer and the
module's optimizer (:func:`lightning_run_settings`); every ``report_every`` optimizer steps
(default: the trainer's ``log_every_n_steps``) it reports the training loss averaged over
those steps with the training fraction, τ, TPP, the schedule and N
(``hpo.integrations.run_report``). What it reads:

* η and λ from the optimizer (``torch.optim.AdamW``): the groups' peak ``lr`` (one value for
  all groups) and the largest ``weight_decay`` (the decayed matrices; biases and norms are
  often in a group without decay);
* S = ``trainer.max_steps``, else the steps Lightning estimates from ``max_epochs``;
* B = the tokens of a training micro-batch (its ``input_ids`` tensor, or its first tensor,
  counted element by element) × ``accumulate_grad_batches`` × ``world_size``, or
  ``tokens_per_step=``;
* the schedule from the LR scheduler (``interval: "step"``): none (constant),
  ``CosineAnnealingLR``, ``LinearLR``, or ``SequentialLR`` of a ``LinearLR`` warmup and one of
  those (:func:`torch_schedule`); another scheduler is an error naming it, unless
  ``schedule=`` says what it is;
* N: every parameter except the embeddings and the output projection (``lm_head`` or
  ``get_output_embeddings()``), or ``n_params=``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import lightning.pytorch as pl
import torch

from hpo.integrations.run_report import (ReportSettingsError, RunSettings, ScheduleSettings, check_positive,
                                         check_report_interval, mean, non_embedding_params, tune_reporter)

#: LR schedulers :func:`torch_schedule` reads.
KNOWN_SCHEDULERS = ("CosineAnnealingLR", "LinearLR", "SequentialLR of LinearLR warmup + CosineAnnealingLR or LinearLR")


def _decay(scheduler: Any, steps: int, peak_lr: float, warmup_fraction: float) -> ScheduleSettings:
    """The decay phase: ``scheduler`` over its ``steps`` (the run's steps after the warmup)."""
    name = type(scheduler).__name__
    if isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR):
        if int(scheduler.T_max) != steps:
            raise ReportSettingsError(f"CosineAnnealingLR.T_max: {scheduler.T_max} is not the {steps} steps it decays "
                                      "over (a cosine that restarts or stops early has no counterpart)")
        return ScheduleSettings("cosine", warmup_fraction, final_fraction=float(scheduler.eta_min) / peak_lr or None)
    if isinstance(scheduler, torch.optim.lr_scheduler.LinearLR):
        start, end = float(scheduler.start_factor), float(scheduler.end_factor)
        if start != 1.0:
            raise ReportSettingsError(f"LinearLR.start_factor: {start:g} in the decay phase; it must start at the peak (1)")
        if end == 1.0:
            return ScheduleSettings("constant", warmup_fraction)
        if int(scheduler.total_iters) != steps:
            raise ReportSettingsError(f"LinearLR.total_iters: {scheduler.total_iters} is not the {steps} steps it "
                                      "decays over")
        if end == 0.0:
            return ScheduleSettings("linear", warmup_fraction)
        if math.isclose(end, 0.1):
            return ScheduleSettings("linear_10x", warmup_fraction)
        return ScheduleSettings("linear", warmup_fraction, final_fraction=end)
    raise ReportSettingsError(f"lr_scheduler: {name} has no counterpart among the predictor's schedules (known: "
                              f"{', '.join(KNOWN_SCHEDULERS)}); pass CollapseReportCallback(schedule=ScheduleSettings(...))")


def torch_schedule(scheduler: Optional[Any], total_steps: int, peak_lr: float) -> ScheduleSettings:
    """The predictor's schedule for a PyTorch LR scheduler stepped once per optimizer step over
    ``total_steps`` (None: a constant rate without warmup)."""
    if scheduler is None:
        return ScheduleSettings("constant", 0.0)
    if isinstance(scheduler, torch.optim.lr_scheduler.SequentialLR):
        parts, milestones = list(scheduler._schedulers), list(scheduler._milestones)
        warm = parts[0] if parts else None
        if (len(parts) != 2 or not isinstance(warm, torch.optim.lr_scheduler.LinearLR)
                or float(warm.end_factor) != 1.0 or int(warm.total_iters) != int(milestones[0])):
            raise ReportSettingsError(
                "lr_scheduler: SequentialLR must be [LinearLR warmup to the peak (end_factor 1, total_iters = the "
                "milestone), then CosineAnnealingLR or LinearLR]; pass CollapseReportCallback(schedule=...) otherwise")
        warmup = int(milestones[0])
        return _decay(parts[1], total_steps - warmup, peak_lr, warmup / total_steps)
    if isinstance(scheduler, torch.optim.lr_scheduler.LinearLR) and float(scheduler.end_factor) == 1.0:
        return ScheduleSettings("constant", int(scheduler.total_iters) / total_steps)  # a warmup, then constant
    return _decay(scheduler, total_steps, peak_lr, 0.0)


def _optimizer_rates(optimizer: Any) -> tuple[float, float]:
    """(η, λ) of an AdamW optimizer (module docstring)."""
    if not isinstance(optimizer, torch.optim.AdamW) and "adamw" not in type(optimizer).__name__.lower():
        raise ReportSettingsError(f"optimizer: {type(optimizer).__name__} is not AdamW; τ = B/(η·λ·D) is the "
                                  "timescale of AdamW's decoupled weight decay")
    rates = {float(group.get("initial_lr", group["lr"])) for group in optimizer.param_groups}
    if len(rates) != 1:
        raise ReportSettingsError(f"optimizer: its parameter groups have different learning rates {sorted(rates)}; "
                                  "one peak rate η is needed")
    lr = check_positive(rates.pop(), "optimizer lr")
    decay = max(float(group.get("weight_decay", 0.0)) for group in optimizer.param_groups)
    return lr, check_positive(decay, "optimizer weight_decay", allow_zero=True)


def batch_tokens(batch: Any) -> int:
    """Tokens in a micro-batch: its ``input_ids`` (a mapping) or its first tensor, every element."""
    if isinstance(batch, dict) and "input_ids" in batch:
        batch = batch["input_ids"]
    elif isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if not isinstance(batch, torch.Tensor) or batch.numel() == 0:
        raise ReportSettingsError("tokens_per_step: cannot count the tokens of a training batch (no 'input_ids' "
                                  "and no tensor first); pass CollapseReportCallback(tokens_per_step=...)")
    return int(batch.numel())


def lightning_run_settings(trainer: Any, module: Any, *, tokens_per_step: int,
                           n_params: Optional[int] = None, schedule: Optional[ScheduleSettings] = None) -> RunSettings:
    """The run's settings from a Lightning trainer and module (module docstring)."""
    total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
    if not math.isfinite(float(total)):
        raise ReportSettingsError("trainer.max_steps: the run has no end (max_steps and max_epochs unset); the "
                                  "training fraction needs the total steps")
    total_steps = int(check_positive(total, "trainer.max_steps"))
    if not trainer.optimizers:
        raise ReportSettingsError("optimizer: the module's configure_optimizers returned none")
    lr, weight_decay = _optimizer_rates(trainer.optimizers[0])
    if schedule is None:
        configs = list(trainer.lr_scheduler_configs)
        if configs and (configs[0].interval != "step" or int(configs[0].frequency) != 1):
            raise ReportSettingsError(f"lr_scheduler interval: {configs[0].interval!r} every {configs[0].frequency}; "
                                      "the schedule is read as stepped once per optimizer step ('step', 1)")
        schedule = torch_schedule(configs[0].scheduler if configs else None, total_steps, lr)
    n = int(check_positive(n_params, "n_params")) if n_params is not None else non_embedding_params(module)
    return RunSettings(lr, weight_decay, int(check_positive(tokens_per_step, "tokens_per_step")), total_steps, n,
                       schedule)


class CollapseReportCallback(pl.Callback):
    """Reports the training loss to Ray Tune with the run's controls (module docstring).

    Args:
        report_every: optimizer steps between reports (default: ``trainer.log_every_n_steps``).
        tokens_per_step: B (default: counted from the first batch).
        n_params: non-embedding parameters N (default: counted from the module).
        schedule: the LR schedule, for a scheduler :func:`torch_schedule` does not read.
        report: where a report goes (default ``ray.tune.report``; a function of one dict).
    """

    def __init__(self, *, report_every: Optional[int] = None, tokens_per_step: Optional[int] = None,
                 n_params: Optional[int] = None, schedule: Optional[ScheduleSettings] = None,
                 report: Optional[Callable[[dict[str, Any]], None]] = None) -> None:
        self.report_every, self.tokens_per_step = report_every, tokens_per_step
        self.n_params, self.schedule = n_params, schedule
        self._report = report
        self.settings: Optional[RunSettings] = None
        self._losses: list[float] = []
        self._last_step = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        self._losses.append(float(loss.detach() if isinstance(loss, torch.Tensor) else loss))
        if self.settings is None:
            tokens = self.tokens_per_step or (batch_tokens(batch) * int(trainer.accumulate_grad_batches)
                                              * int(trainer.world_size))
            self.settings = lightning_run_settings(trainer, pl_module, tokens_per_step=tokens, n_params=self.n_params,
                                                   schedule=self.schedule)
            every = self.report_every or int(trainer.log_every_n_steps)
            check_report_interval(every, self.settings.total_steps,
                                  "report_every" if self.report_every else "trainer.log_every_n_steps")
            self.report_every = every
            if self._report is None:
                self._report = tune_reporter()
        step = int(trainer.global_step)
        if step > self._last_step and (step % self.report_every == 0 or step >= self.settings.total_steps):
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            self._report(self.settings.report(step, mean(self._losses), lr))
            self._losses, self._last_step = [], step
