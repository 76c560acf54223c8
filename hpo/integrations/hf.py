"""Report a Hugging Face ``Trainer``'s run to Ray Tune as ``CollapseScheduler`` reads it.

``pip install -e ".[hf]"``; then, inside a Ray Tune trainable::

    trainer = Trainer(model, args, train_dataset=..., callbacks=[CollapseReportCallback()])
    trainer.train()

At the start of training the callback derives the run's controls from the trainer's own
settings (:func:`hf_run_settings`) and, at every logging step, reports the training loss
averaged since the previous log with the training fraction, τ, TPP, the schedule and N
(``hpo.integrations.run_report``). What it reads:

* η = ``learning_rate``; λ = ``weight_decay`` (an AdamW ``optim``; τ needs decoupled decay);
* S = the trainer's ``max_steps`` (from ``max_steps``, else the epochs it computed);
* B = ``per_device_train_batch_size`` × ``gradient_accumulation_steps`` × ``world_size`` ×
  the sequence length: ``seq_len=`` if given, else the length of the training set's first
  ``input_ids`` (fixed-length blocks; with padded batches of varying length pass ``seq_len``);
* the schedule from ``lr_scheduler_type``, ``lr_scheduler_kwargs`` and the warmup
  (``warmup_steps``/``warmup_ratio``): see :func:`hf_schedule`;
* N: every parameter except the embeddings and the output projection
  (:func:`~hpo.integrations.run_report.non_embedding_params`), or ``n_params=``.

The Trainer's optimizer and scheduler are assumed to be the ones its arguments create: a
Trainer given ``optimizers=(...)`` of its own is reported from its arguments all the same.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from transformers import TrainerCallback

from hpo.integrations.run_report import (ReportSettingsError, RunSettings, ScheduleSettings, check_positive,
                                         check_report_interval, non_embedding_params, tune_reporter)

#: ``lr_scheduler_type`` values this maps to a predictor schedule (:func:`hf_schedule`).
KNOWN_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr",
                    "cosine_warmup_with_min_lr", "warmup_stable_decay")


def _name(value: Any) -> str:
    """An enum's value (``SchedulerType.LINEAR`` → ``"linear"``) or the string itself."""
    return str(getattr(value, "value", value))


def hf_schedule(args: Any, total_steps: int) -> ScheduleSettings:
    """The schedule HF's ``lr_scheduler_type`` gives over ``total_steps`` optimizer steps.

    ``linear`` → linear decay to zero; ``cosine`` → half-cosine to zero; ``constant`` →
    constant without warmup (HF's ignores the warmup); ``constant_with_warmup`` → constant;
    ``cosine_with_min_lr`` / ``cosine_warmup_with_min_lr`` → cosine with ``final_fraction`` =
    ``min_lr_rate`` (or ``min_lr`` / ``learning_rate``); ``warmup_stable_decay`` → ``wsd`` with
    ``decay_fraction`` = ``num_decay_steps`` / S, ``final_fraction`` = ``min_lr_ratio`` and
    ``decay_shape`` from ``decay_type`` (``linear`` or ``1-sqrt``). Anything else is an error
    naming the value.
    """
    kind = _name(args.lr_scheduler_type)
    kwargs = dict(args.lr_scheduler_kwargs or {}) if isinstance(args.lr_scheduler_kwargs, dict) else {}
    warmup = args.get_warmup_steps(total_steps) / total_steps
    where = "TrainingArguments.lr_scheduler_kwargs"
    if kind not in KNOWN_SCHEDULERS:
        raise ReportSettingsError(
            f"TrainingArguments.lr_scheduler_type: {kind!r} has no counterpart among the predictor's schedules; "
            f"use one of {KNOWN_SCHEDULERS}")
    if kind in ("cosine", "cosine_with_min_lr", "cosine_warmup_with_min_lr") and float(kwargs.get("num_cycles", 0.5)) != 0.5:
        raise ReportSettingsError(f"{where}.num_cycles: {kwargs['num_cycles']!r}; the predictor's cosine is one "
                                  "half-cosine (num_cycles 0.5)")
    if kind == "linear":
        return ScheduleSettings("linear", warmup)
    if kind == "cosine":
        return ScheduleSettings("cosine", warmup)
    if kind == "constant":
        return ScheduleSettings("constant", 0.0)
    if kind == "constant_with_warmup":
        return ScheduleSettings("constant", warmup)
    if kind in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        if kwargs.get("min_lr_rate") is not None:
            floor = check_positive(kwargs["min_lr_rate"], f"{where}.min_lr_rate", allow_zero=True)
        elif kwargs.get("min_lr") is not None:
            floor = check_positive(kwargs["min_lr"], f"{where}.min_lr", allow_zero=True) / float(args.learning_rate)
        else:
            raise ReportSettingsError(f"{where}: {kind} needs min_lr_rate or min_lr")
        return ScheduleSettings("cosine", warmup, final_fraction=floor)
    # warmup_stable_decay
    if "num_decay_steps" not in kwargs:
        raise ReportSettingsError(f"{where}.num_decay_steps: warmup_stable_decay needs it")
    decay_steps = check_positive(kwargs["num_decay_steps"], f"{where}.num_decay_steps")
    stable = kwargs.get("num_stable_steps")
    warmup_steps = args.get_warmup_steps(total_steps)
    if stable is not None and int(warmup_steps) + int(stable) + int(decay_steps) != total_steps:
        raise ReportSettingsError(
            f"{where}.num_stable_steps: warmup {warmup_steps} + stable {stable} + decay {decay_steps:g} steps is not "
            f"the run's {total_steps} steps (the rate would sit at its floor for the rest); leave it unset")
    decay_type = str(kwargs.get("decay_type", "cosine"))
    shapes = {"linear": "linear", "1-sqrt": "sqrt"}
    if decay_type not in shapes:
        raise ReportSettingsError(f"{where}.decay_type: {decay_type!r} (HF's default is 'cosine'); the predictor's "
                                  "WSD decays 'linear' or '1-sqrt': set one of those")
    if str(kwargs.get("warmup_type", "linear")) != "linear":
        raise ReportSettingsError(f"{where}.warmup_type: {kwargs['warmup_type']!r}; the predictor's warmup is linear")
    floor = check_positive(kwargs.get("min_lr_ratio", 0.0), f"{where}.min_lr_ratio", allow_zero=True)
    return ScheduleSettings("wsd", warmup, decay_fraction=decay_steps / total_steps, final_fraction=floor,
                            decay_shape=shapes[decay_type])


def _seq_len(train_dataloader: Any) -> int:
    """The length of the training set's first ``input_ids`` (fixed-length blocks)."""
    try:
        first = train_dataloader.dataset[0]
        return int(len(first["input_ids"]))
    except Exception:  # noqa: BLE001 - any dataset it cannot index: say what to pass instead
        raise ReportSettingsError(
            "seq_len: cannot be read from the training set (its first item has no 'input_ids' of fixed length); "
            "pass CollapseReportCallback(seq_len=...), the tokens per sequence") from None


def hf_run_settings(args: Any, state: Any, model: Any, *, train_dataloader: Any = None,
                    seq_len: Optional[int] = None, n_params: Optional[int] = None) -> RunSettings:
    """The run's settings from ``TrainingArguments``, the trainer's state (its ``max_steps``)
    and the model (module docstring); a :class:`ReportSettingsError` naming the first value
    that cannot be derived."""
    optim = _name(args.optim)
    if "adamw" not in optim.lower():
        raise ReportSettingsError(f"TrainingArguments.optim: {optim!r} is not AdamW; τ = B/(η·λ·D) is the timescale "
                                  "of AdamW's decoupled weight decay")
    total_steps = int(check_positive(getattr(state, "max_steps", 0) or args.max_steps, "TrainingArguments.max_steps"))
    lr = check_positive(args.learning_rate, "TrainingArguments.learning_rate")
    weight_decay = check_positive(args.weight_decay, "TrainingArguments.weight_decay", allow_zero=True)
    length = int(check_positive(seq_len, "seq_len")) if seq_len is not None else _seq_len(train_dataloader)
    per_device = int(check_positive(args.per_device_train_batch_size, "TrainingArguments.per_device_train_batch_size"))
    accumulation = int(check_positive(args.gradient_accumulation_steps, "TrainingArguments.gradient_accumulation_steps"))
    tokens_per_step = per_device * accumulation * int(args.world_size) * length
    n = int(check_positive(n_params, "n_params")) if n_params is not None else non_embedding_params(model)
    interval = args.logging_steps if args.logging_steps >= 1 else args.logging_steps * total_steps
    if _name(args.logging_strategy) != "steps":
        raise ReportSettingsError(f"TrainingArguments.logging_strategy: {_name(args.logging_strategy)!r}; the "
                                  "callback reports at each logged loss: use 'steps'")
    check_report_interval(interval, total_steps, "TrainingArguments.logging_steps")
    return RunSettings(lr, weight_decay, tokens_per_step, total_steps, n, hf_schedule(args, total_steps))


class CollapseReportCallback(TrainerCallback):
    """Reports each logged training loss to Ray Tune with the run's controls (module docstring).

    Args:
        seq_len: tokens per sequence (default: read from the training set's first item).
        n_params: non-embedding parameters N (default: counted from the model).
        report: where a report goes (default ``ray.tune.report``; a function of one dict).
    """

    def __init__(self, *, seq_len: Optional[int] = None, n_params: Optional[int] = None,
                 report: Optional[Callable[[dict[str, Any]], None]] = None) -> None:
        self.seq_len, self.n_params = seq_len, n_params
        self._report = report
        self.settings: Optional[RunSettings] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        self.settings = hf_run_settings(args, state, model, train_dataloader=train_dataloader,
                                        seq_len=self.seq_len, n_params=self.n_params)
        if self._report is None:
            self._report = tune_reporter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict[str, Any]] = None,
               **kwargs: Any) -> None:
        if self.settings is None or not logs or "loss" not in logs or self._report is None:
            return  # an evaluation log, or the final train summary (train_loss)
        self._report(self.settings.report(state.global_step, logs["loss"], logs.get("learning_rate")))
