"""A run's keys in one table: each key's name, type, and where it goes.

A run's controls and identity travel through several places: every report of a trial
(``hpo.trials.trainable.report_controls``), the MLflow params of its run (``hpo.tracking.runs``), the
curve bank's columns (``hpo.trials.curve_bank``, ``hpo.calibration.banking``), the replay that re-reports a banked
curve (``hpo.trials.replay``), the values that name a sweep's kind (``predictors.kinds.sweep_kind``), and the columns of
one point of a curve (``trainers.runner``). Each of those lists derives from :data:`RUN_KEYS`
and :data:`POINT_KEYS` (:func:`names`), so a key added here reaches every one it is marked for.

The column order of the bank and of a curve file is this table's order (a bank written before
a change keeps its columns).

Example:
    >>> names(reported=True, banked=True)[:4]
    ('tau', 'tokens_per_param', 'schedule', 'warmup_fraction')
    >>> "decay_fraction" in names(param=True), "eta_hidden" in names(banked=True)
    (False, False)
    >>> KEY_TYPES["n_params"], KEY_TYPES["step"]
    (<class 'int'>, <class 'int'>)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional


@dataclass(frozen=True)
class RunKey:
    """One key of a run.

    Args:
        name: the key, as reported, logged and banked.
        type: what a value is read as (``int``, ``float`` or ``str``).
        reported: in every report of a trial (the run's controls, constant over the run).
        param: logged once per trial as an MLflow param (what one filters runs by).
        banked: a run column of the curve bank.
        from_result: a bank column taken from the run's last result (False: written by the
            banking itself: the sweep banked and how the run ended).
        bank_default: for a bank column added later, what a bank written before it reads as
            (None: every bank has the column).
        config: identifies a configuration (same values and another seed: a repeat).
        sweep_value: a value a sweep can vary, which names the sweep's kind
            (``predictors.kinds``).
    """

    name: str
    type: type
    reported: bool = False
    param: bool = False
    banked: bool = False
    from_result: bool = True
    bank_default: Optional[Any] = None
    config: bool = False
    sweep_value: bool = False


def _control(name: str, type_: type, *, param: bool = True, sweep_value: bool = False) -> RunKey:
    """A control of the run: reported, banked and identifying its configuration."""
    return RunKey(name, type_, reported=True, param=param, banked=True, config=True, sweep_value=sweep_value)


#: The run-level keys, in the bank's column order.
RUN_KEYS: tuple[RunKey, ...] = (
    RunKey("run_id", str, banked=True),
    RunKey("sweep", str, banked=True, from_result=False),
    _control("tau", float, sweep_value=True),
    _control("tokens_per_param", float, sweep_value=True),
    _control("schedule", str, sweep_value=True),
    _control("warmup_fraction", float),
    # Not an MLflow param so far (the params predate it); kept so, for outputs unchanged.
    _control("decay_fraction", float, param=False),
    _control("n_params", int, sweep_value=True),
    _control("total_tokens", int),
    _control("batch_size", int, sweep_value=True),
    _control("eta", float, sweep_value=True),
    # The per-layer values the parameterisation derives (hidden layers): reported and logged,
    # not banked (the bank re-derives them from its config_json).
    RunKey("eta_hidden", float, reported=True, param=True),
    _control("weight_decay", float, sweep_value=True),
    RunKey("lambda_hidden", float, reported=True, param=True),
    RunKey("d_model", int, banked=True, config=True),
    RunKey("n_layers", int, banked=True, config=True),
    RunKey("seq_len", int, banked=True, config=True),
    RunKey("seed", int, reported=True, param=True, banked=True),
    RunKey("data_seed", int, reported=True, param=True, banked=True),
    RunKey("corpus_hash", str, banked=True),
    RunKey("status", str, banked=True, from_result=False),
    RunKey("config_json", str, banked=True),
    RunKey("vocab_size", int, banked=True, bank_default=256),
    RunKey("epochs", float, banked=True, bank_default=math.nan),
    # The schedule's floor and WSD cooldown shape (predictors.schedules): controls, not MLflow
    # params (like decay_fraction: the params stay as they were); banks from before them read
    # as the only values there were then.
    RunKey("final_fraction", float, reported=True, banked=True, bank_default=0.0, config=True),
    RunKey("decay_shape", str, reported=True, banked=True, bank_default="linear", config=True),
)
#: The keys of one point of a curve (a row of a curve file, a bank row's point part), in order.
POINT_KEYS: tuple[RunKey, ...] = (
    RunKey("step", int), RunKey("tokens", int), RunKey("train_fraction", float), RunKey("train_loss", float),
    RunKey("smoothed_loss", float), RunKey("val_loss", float), RunKey("lr", float),
)
#: Every key's type, by name.
KEY_TYPES: dict[str, type] = {k.name: k.type for k in RUN_KEYS + POINT_KEYS}

_FLAGS = {f.name for f in fields(RunKey)} - {"name"}


def names(*, point: bool = False, **flags: Any) -> tuple[str, ...]:
    """The names of the run keys (``point``: the point keys) whose fields equal ``flags``
    (``reported=True, banked=True``; ``type=int``; ``bank_default=None``: the columns every bank has), in the table's order; an unknown flag is
    a TypeError naming it."""
    unknown = [f for f in flags if f not in _FLAGS]
    if unknown:
        raise TypeError(f"run_keys.names: unknown field(s) {unknown}; known: {sorted(_FLAGS)}")
    table = POINT_KEYS if point else RUN_KEYS
    return tuple(k.name for k in table if all(getattr(k, f) == v for f, v in flags.items()))


#: The losses a sweep can decide on (``scheduler.metric``) and a predictor be fitted on (``hpo
#: calibrate``'s ``metric``), each with the report key (and curve-bank column) that holds its
#: curve: ``loss`` is the smoothed training loss (trailing mean over ``smoothing_tokens``),
#: ``val_loss`` the loss on the trainer's fixed held-out windows (``trainers.train.Trainer.evaluate``),
#: a curve only where the trainer evaluated at every report (``eval_every`` <= ``log_every``).
METRIC_COLUMNS: dict[str, str] = {"loss": "smoothed_loss", "val_loss": "val_loss"}
#: What a predictor file without a recorded metric was fitted on (every one before it was recorded).
DEFAULT_METRIC = "loss"
#: The metrics in words (early answers, reports).
METRIC_WORDS: dict[str, str] = {"loss": "training loss (smoothed)", "val_loss": "validation loss"}


def bank_defaults() -> dict[str, Any]:
    """The bank columns added later, with what a bank written before them reads as."""
    return {k.name: k.bank_default for k in RUN_KEYS if k.banked and k.bank_default is not None}


__all__ = ["DEFAULT_METRIC", "KEY_TYPES", "METRIC_COLUMNS", "METRIC_WORDS", "POINT_KEYS", "RUN_KEYS", "RunKey", "bank_defaults", "names"]
