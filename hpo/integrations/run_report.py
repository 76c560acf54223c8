"""What a trainer of another framework must report to ``CollapseScheduler``, derived from the
settings it already holds (the report contract: ``hpo.decisions.scheduler_contract``).

A run's controls follow from five numbers and its schedule: the peak learning rate η, AdamW's
weight decay λ (PyTorch's, applied as η·λ per step), the tokens per optimizer step B, the
optimizer steps S and the non-embedding parameters N. Then D = B·S tokens, τ = B/(η·λ·D) =
1/(η·λ·S) and TPP = D/N. The callbacks (:mod:`hpo.integrations.hf`,
:mod:`hpo.integrations.lightning`) read these from their trainer and hand them here; every
value that cannot be derived is one :class:`ReportSettingsError` naming it.

Example:
    >>> s = RunSettings(peak_lr=1e-2, weight_decay=0.1, tokens_per_step=4096, total_steps=5000,
    ...                 n_params=1_024_000, schedule=ScheduleSettings("cosine", warmup_fraction=0.05))
    >>> c = s.controls()
    >>> round(c["tau"], 6), c["tokens_per_param"], c["total_tokens"], c["schedule"]
    (0.2, 20.0, 20480000, 'cosine')
    >>> s.report(step=500, loss=3.5)["train_fraction"]
    0.1
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from hpo.common.errors import InputError
from predictors.schedules import SCHEDULE_NAMES, Schedule

#: How a WSD or linear decay may fall (the shapes the predictor's schedules are given):
#: "linear", or "sqrt" (1 - sqrt(progress), HF's "1-sqrt").
DECAY_SHAPES = ("linear", "sqrt")
#: Reports needed before the earliest default rung (t̂ = 0.1): the scheduler decides a trial
#: on at least 3 points of its curve (``rules.DEFAULT_MIN_POINTS``), so a trainer must report
#: at least every 3% of its steps.
MAX_REPORT_INTERVAL_FRACTION = 0.03


class ReportSettingsError(InputError):
    """A value the scheduler needs cannot be derived from the trainer's settings; the message
    names the setting (``TrainingArguments.lr_scheduler_type``, ``trainer.max_steps``...)."""


def check_positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``), else an error naming ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ReportSettingsError(f"{name}: must be a finite number {bound} to derive the run's controls, got {value!r}")
    return number


@dataclass(frozen=True)
class ScheduleSettings:
    """The learning-rate schedule as the predictor names it (``predictors.schedules``).

    ``final_fraction`` (the floor as a fraction of the peak: cosine to 10% is 0.1) and
    ``decay_shape`` are reported for the schedules that have them (cosine with a floor, WSD);
    a scheduler that does not read them yet ignores them.
    """

    name: str
    warmup_fraction: float = 0.0
    decay_fraction: Optional[float] = None
    final_fraction: Optional[float] = None
    decay_shape: Optional[str] = None

    def __post_init__(self) -> None:
        if self.name not in SCHEDULE_NAMES:
            raise ReportSettingsError(f"schedule: {self.name!r} is not one of {SCHEDULE_NAMES}")
        if self.decay_shape is not None and self.decay_shape not in DECAY_SHAPES:
            raise ReportSettingsError(f"decay_shape: {self.decay_shape!r} is not one of {DECAY_SHAPES}")
        if self.final_fraction is not None and not (0.0 <= self.final_fraction < 1.0):
            raise ReportSettingsError(f"final_fraction: {self.final_fraction!r} is outside [0, 1) of the peak rate")
        try:  # the checks of the one schedule definition (warmup in [0, 1), WSD's decay fits)
            Schedule(self.name, self.warmup_fraction,  # type: ignore[arg-type]
                     self.decay_fraction if self.decay_fraction is not None else Schedule().decay_fraction)
        except ValueError as exc:
            raise ReportSettingsError(str(exc)) from None

    def keys(self) -> dict[str, Any]:
        """The schedule's report keys."""
        out: dict[str, Any] = {"schedule": self.name, "warmup_fraction": float(self.warmup_fraction)}
        if self.decay_fraction is not None:
            out["decay_fraction"] = float(self.decay_fraction)
        if self.final_fraction is not None:
            out["final_fraction"] = float(self.final_fraction)
        if self.decay_shape is not None:
            out["decay_shape"] = self.decay_shape
        return out


@dataclass(frozen=True)
class RunSettings:
    """The settings of one run that its reports are derived from.

    Args:
        peak_lr: η, the schedule's peak learning rate.
        weight_decay: λ as PyTorch's AdamW takes it (each step decays by η(t)·λ); 0: τ = ∞.
        tokens_per_step: B, tokens per optimizer step (all devices and accumulated micro-batches).
        total_steps: S, the optimizer steps the run is scheduled for.
        n_params: N, non-embedding parameters (:func:`non_embedding_params`).
        schedule: the learning-rate schedule.
    """

    peak_lr: float
    weight_decay: float
    tokens_per_step: int
    total_steps: int
    n_params: int
    schedule: ScheduleSettings

    @property
    def total_tokens(self) -> int:
        return int(self.tokens_per_step) * int(self.total_steps)

    def controls(self) -> dict[str, Any]:
        """The constant part of every report: τ = B/(η·λ·D), TPP = D/N, the schedule, and the
        values a sweep varies (η, B in tokens, λ), under the keys the scheduler and
        ``predictors.run_keys`` use."""
        tau = math.inf if self.weight_decay == 0 else self.tokens_per_step / (
            self.peak_lr * self.weight_decay * self.total_tokens)
        return {"tau": tau, "tokens_per_param": self.total_tokens / self.n_params, **self.schedule.keys(),
                "n_params": int(self.n_params), "total_tokens": self.total_tokens,
                "batch_size": int(self.tokens_per_step), "eta": float(self.peak_lr),
                "weight_decay": float(self.weight_decay)}

    def report(self, step: int, loss: float, lr: Optional[float] = None) -> dict[str, Any]:
        """One report after ``step`` optimizer steps, ``loss`` the training loss averaged over
        the steps since the previous report (a smoothed loss, as the scheduler expects)."""
        out = {**self.controls(), "loss": float(loss), "train_fraction": min(step / self.total_steps, 1.0),
               "step": int(step), "tokens": int(step) * int(self.tokens_per_step)}
        if lr is not None:
            out["lr"] = float(lr)
        return out


def check_report_interval(interval_steps: float, total_steps: int, name: str) -> None:
    """Refuse a report interval too sparse for the earliest rung (``MAX_REPORT_INTERVAL_FRACTION``)."""
    largest = max(1, math.floor(MAX_REPORT_INTERVAL_FRACTION * total_steps))
    if interval_steps > largest:
        raise ReportSettingsError(
            f"{name}: reports every {interval_steps:g} of {total_steps} steps; the scheduler needs 3 reports "
            f"before its first rung at 10% of training: set it to at most {largest}")


def non_embedding_params(model: Any, unembedding: Optional[Any] = None) -> int:
    """N as the project's trainer counts it: every parameter except the token and position
    embeddings (each ``torch.nn.Embedding``) and the output projection (``unembedding``, or the
    module ``get_output_embeddings()`` gives, or one named ``lm_head``); a parameter shared by
    several modules (tied weights) counted once."""
    import torch

    excluded: set[int] = set()
    output = unembedding
    if output is None and callable(getattr(model, "get_output_embeddings", None)):
        output = model.get_output_embeddings()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) or module is output or name.rsplit(".", 1)[-1] == "lm_head":
            excluded.update(id(p) for p in module.parameters())
    seen: set[int] = set()
    total = 0
    for parameter in model.parameters():
        if id(parameter) in seen or id(parameter) in excluded:
            continue
        seen.add(id(parameter))
        total += parameter.numel()
    if total <= 0:
        raise ReportSettingsError("n_params: the model has no parameters outside its embeddings; pass n_params=")
    return total


def tune_reporter() -> Callable[[dict[str, Any]], None]:
    """``ray.tune.report`` (imported only when a callback reports)."""
    from ray import tune

    return tune.report


def mean(values: Iterable[float]) -> float:
    items = [float(v) for v in values]
    return sum(items) / len(items) if items else math.nan
