"""What :class:`hpo.decisions.scheduler.CollapseScheduler` is given: its settings
(:class:`SchedulerSettings`, checked once), and the report contract (``docs/design.md``): what a
trial's results must carry, checked as each one is read.

Every result carries the metric and the training fraction t̂ ∈ [0, 1] (``time_attr``); the
controls τ and TPP (and the schedule, else its default, said once) come from the results or
the trial's config; t̂ never goes back within one run of a trainable. A broken contract is a
:class:`SchedulerContractError` naming the trial and the key: the scheduler cannot predict
without it, and would otherwise keep every trial silently.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Literal, Mapping, NamedTuple, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from predictors.kinds import sweep_values
from hpo.common.errors import InputError, announce, exit_2_on_uncaught
from hpo.decisions.keep import KeepRule, make_rule
from hpo.decisions.scheduler_records import TrialRecord
from predictors.controls import Controls
from predictors.curves import T_HAT_EPS
from predictors.io import finite_or_none
from predictors.prediction import DEFAULT_MIN_POINTS
from predictors.run_keys import METRIC_COLUMNS
from predictors.schedules import SCHEDULE_NAMES, Schedule
from trainers.config import refuse_bool_number

logger = logging.getLogger("hpo.decisions.scheduler")

#: Controls a result (or the trial's config) must carry: without them nothing can be predicted.
CONTROL_KEYS = ("tau", "tokens_per_param")
#: What a result without a schedule is taken to mean (Controls.from_mapping's defaults), said once.
SCHEDULE_DEFAULTS = {"schedule": Schedule().name, "warmup_fraction": Schedule().warmup_fraction,
                     "decay_fraction": Schedule().decay_fraction, "final_fraction": Schedule().final_fraction,
                     "decay_shape": Schedule().decay_shape}
#: Defaults taken without a word: the floor (0) and cooldown shape (linear) were the only ones
#: before they were reported, so a trainable that predates them means exactly these.
SILENT_DEFAULTS = ("final_fraction", "decay_shape")


class SchedulerContractError(InputError):
    """A trial's results break the report contract (``docs/design.md``); names the key. An
    :class:`~hpo.common.errors.InputError`: the CLI prints it as one line (exit status 2)."""


def flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config flattened (``a/b`` keys, and each leaf under its own name too)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}/"))
        out[f"{prefix}{key}"] = value
        out.setdefault(str(key), value)
    return out


class Reading(NamedTuple):
    """A result as the scheduler takes it: t̂ and the metric (None: the trial diverged)."""

    t: float
    value: Optional[float]


class ReportReader:
    """Reads results against the contract; remembers per trial what it read in this process
    (its controls, read once; its last (iteration, t̂) since a restore) and which warnings
    it has given (each once per sweep)."""

    def __init__(self, time_attr: str) -> None:
        self.time_attr = time_attr
        self.warned: set[str] = set()
        self.reset()

    def reset(self) -> None:
        """Forget what this process read (a restored scheduler reads controls again)."""
        self.controls_read: set[str] = set()
        # Per trial, (iterations_since_restore, t̂) of its last result in this process: within one
        # run of a trainable (no restore between) t̂ may never go back.
        self.session: dict[str, tuple[int, float]] = {}

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning(message, *args)

    def warn_restart(self, trial_id: str, t: float) -> None:
        """Sync mode saw a trial begin again below the first rung after a pause."""
        self.warn_once("restart", "CollapseScheduler: trial %s restarted from t̂=%.3g after a pause: its trainable "
                       "does not restore checkpoints, so sync mode trains it twice up to each rung (use a class "
                       "trainable with save/load_checkpoint, tune.get_checkpoint(), or mode async: scheduler.mode, "
                       "SchedulerSettings(mode='async'))",
                       trial_id, t)

    def read(self, rec: TrialRecord, result: Mapping[str, Any], metric: Optional[str]) -> Reading:
        """Check a result; take its compute weights, and (once) the trial's controls and sweep
        values into ``rec``. The metric is None when it is not finite or ``diverged`` is set."""
        if self.time_attr not in result or finite_or_none(result.get(self.time_attr)) is None:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {rec.trial_id}: result has no finite {self.time_attr!r} "
                f"(the training fraction t̂ in [0, 1]); keys: {sorted(result)[:20]}")
        t = float(result[self.time_attr])
        if not (-T_HAT_EPS <= t <= 1.0 + 1e-6):
            raise SchedulerContractError(
                f"CollapseScheduler: trial {rec.trial_id}: {self.time_attr} = {t:g} is outside [0, 1]; "
                "report the training fraction (tokens seen / total tokens), not an iteration count or a percent")
        if metric not in result:
            raise SchedulerContractError(f"CollapseScheduler: trial {rec.trial_id}: result has no {metric!r}")
        self._check_monotone(rec.trial_id, t, result.get("iterations_since_restore"))
        for key in ("n_params", "total_tokens"):
            value = finite_or_none(result.get(key))
            if value is not None and value > 0:
                setattr(rec, key, value)
        if rec.trial_id not in self.controls_read or rec.controls is None:
            # A trial's controls do not change: read them once per process (and until found).
            merged = {**flat(rec.config), **result}
            rec.controls = self._controls(rec.trial_id, merged)
            rec.sweep_values = sweep_values(merged)
            self.controls_read.add(rec.trial_id)
        value = finite_or_none(result.get(metric))
        return Reading(t, None if value is None or bool(result.get("diverged", False)) else value)

    def _check_monotone(self, trial_id: str, t: float, iteration: Any) -> None:
        """Refuse t̂ going backwards within one run of a trainable. Ray counts the results since
        the last (re)start in ``iterations_since_restore``; a smaller t̂ after a restore (a
        checkpoint, or a trainable restarted after a pause) is a rewind the history handles, but
        a smaller t̂ in the same run means the trainable reports something else than the
        training fraction, and would silently rewrite the curve the rungs are decided on."""
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            return  # no Ray bookkeeping (a hand-driven scheduler): restores cannot be told apart
        last = self.session.get(trial_id)
        if last is not None and iteration > last[0] and t < last[1] - T_HAT_EPS:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {trial_id}: {self.time_attr} went back from {last[1]:g} to {t:g} "
                f"within one run of its trainable (result {iteration} since its last restore); report the "
                "training fraction, which only grows (tokens seen / total tokens)")
        self.session[trial_id] = (iteration, t)

    def _controls(self, trial_id: str, merged: Mapping[str, Any]) -> Controls:
        """A trial's controls from its result and config. Without ``tau`` or ``tokens_per_param``
        no prediction can be made and every trial would silently be kept at every rung: a
        contract error. A missing schedule or warmup takes the default, said once per sweep
        (a cosine run read as linear is predicted with the wrong shape)."""
        missing = [key for key in CONTROL_KEYS if merged.get(key) is None]
        if missing:
            raise SchedulerContractError(
                f"CollapseScheduler: trial {trial_id}: neither its result nor its config has "
                f"{' or '.join(repr(k) for k in missing)} (the run's controls: AdamW timescale τ = B/(η·λ·D) and "
                "tokens per parameter D/N); report them in every result, or nothing can be predicted and no "
                "trial stopped")
        absent = [key for key in SCHEDULE_DEFAULTS if merged.get(key) is None and key not in SILENT_DEFAULTS
                  and (key != "decay_fraction" or merged.get("schedule") == "wsd")]
        if absent:
            assumed = ", ".join(f"{key}={SCHEDULE_DEFAULTS[key]!r}" for key in absent)
            if "schedule" in absent:
                assumed += " (warmup, then linear decay to zero)"
            self.warn_once("schedule-defaults", "CollapseScheduler: trial %s reports no %s: assuming %s for every "
                           "trial that lacks them; a run with another schedule is then predicted with the wrong "
                           "shape: report 'schedule' (one of %s) and 'warmup_fraction' in every result", trial_id,
                           " or ".join(repr(key) for key in absent), assumed, ", ".join(SCHEDULE_NAMES))
        try:
            return Controls.from_mapping(merged)
        except (KeyError, ValueError, TypeError) as exc:
            raise SchedulerContractError(f"CollapseScheduler: trial {trial_id}: unusable controls: "
                                         f"{str(exc).strip(chr(39))}") from None


#: The default rungs: one at t̂ = 0.3, chosen leave-one-corpus-out with the collapse rule's
#: margin_z (``benchmarks/decisions.py::select_default``; docs/decisions.md).
DEFAULT_RUNGS = (0.3,)


def check_mode(mode: Optional[str]) -> None:
    if mode == "max":
        raise ValueError("mode: 'max' is not supported: CollapseScheduler predicts final losses, "
                         "lower is better; report a loss and use mode='min'")
    if mode not in (None, "min"):
        raise ValueError(f"mode: must be 'min' or None, got {mode!r}")


def check_rungs(rungs: Any) -> list[float]:
    """The decision fractions as floats, or a ValueError saying what is wrong: at least one,
    each strictly inside (0, 1) (a rung at t̂ = 1 would decide after every trial finished,
    saving nothing), strictly increasing (``SchedulerSettings.rungs``)."""
    try:
        fractions = [float(r) for r in rungs]
    except (TypeError, ValueError):
        raise ValueError(f"rungs: give a list of fractions in (0, 1), got {rungs!r}") from None
    if not fractions:
        raise ValueError("rungs: list at least one decision fraction")
    if any(not (0.0 < r < 1.0) for r in fractions):
        raise ValueError(f"rungs: every rung must lie in (0, 1), got {fractions}")
    if any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise ValueError(f"rungs: must be strictly increasing, got {fractions}")
    return fractions


class SchedulerSettings(BaseModel):
    """What ``CollapseScheduler`` decides with (the sweep config's ``scheduler:`` section): the
    one check of these knobs, and the one object the scheduler takes (``rule``: its knobs
    checked by the rule's constructor, ``hpo.decisions.keep.make_rule``)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error that names it

    mode: Literal["sync", "async", "audit"] = "sync"
    rungs: list[float] = Field(default_factory=lambda: list(DEFAULT_RUNGS))  # DEFAULT_RUNGS says why
    reduction_factor: float = 2.0
    # "calibrated" (default): the rule's own margin (collapse: rule.margin_z times the σ of the
    # order calibration measured for this kind of sweep, at the rung); a number: a fixed margin
    # in log units (0.02 ≈ 2%) on the predicted finals at every rung.
    margin: Union[str, float] = "calibrated"
    # How close two final losses must be to count as the same result, in loss units (None:
    # the seed noise hpo calibrate measured, stored in the predictor). A trial is kept past
    # the top ceil(n/rf) only if it could still end better than the best by more than this.
    tolerance: Optional[float] = Field(None, ge=0)
    # The loss the scheduler aligns and ranks on (predictors.run_keys.METRIC_COLUMNS): "loss",
    # the smoothed training loss; "val_loss", the loss on the trainer's fixed held-out windows,
    # evaluated at every report (trainer.eval_every defaults to log_every then). The predictor
    # must have been fitted on the same metric (hpo calibrate's metric).
    metric: Literal["loss", "val_loss"] = "loss"
    # The keep rule and its knobs (hpo.decisions.keep): a name, or {name: collapse, margin_z: 0.5};
    # "collapse" (default), or a baseline to compare against on the same sweep: "asha",
    # "current-best", "top-k" ({name: top-k, k: 2}), "paired-test" (experimental). Stored as
    # the rule's full settings (KeepRule.settings: every knob, defaults included).
    rule: dict[str, Any] = Field(default_factory=lambda: make_rule("collapse").settings())
    # Fewest history points up to a rung needed to predict there; a trial with fewer is kept and
    # does not count towards ceil(n/rf).
    min_points: int = Field(DEFAULT_MIN_POINTS, ge=1)
    # Rank by the predicted finals even 30x or more beyond the predictor's calibrated model sizes
    # (predictors.predictor.OFF_SCALE_SIZE_RATIO); by default such a sweep ranks by its losses.
    trust_off_scale: bool = False

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_bool_number(cls, value, info)

    @model_validator(mode="before")
    @classmethod
    def _margin_z_goes_with_the_rule(cls, data: Any) -> Any:
        # scheduler.margin_z (configs written before the rule took its knobs): the collapse
        # rule's knob, moved where it lives.
        if isinstance(data, dict) and "margin_z" in data:
            data = dict(data)
            z = data.pop("margin_z")
            rule = data.get("rule", "collapse")
            rule = {"name": rule} if isinstance(rule, str) else dict(rule)
            if rule.get("name", "collapse") != "collapse":
                raise ValueError(f"margin_z is the collapse rule's knob, not {rule.get('name')!r}'s")
            data["rule"] = {"name": "collapse", **rule, "margin_z": z}
        return data

    @field_validator("rule", mode="before")
    @classmethod
    def _rule(cls, value: Any) -> Any:
        # The rule's constructor is the one check of its knobs.
        if not isinstance(value, (str, dict)):
            raise ValueError(f"give a rule name or {{name: ..., knob: ...}}, got {value!r}")
        try:
            return make_rule(value).settings()
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("scheduler.rule: ")) from None

    @field_validator("rungs")
    @classmethod
    def _rungs_in_range(cls, rungs: list[float]) -> list[float]:
        try:  # check_rungs's message without its "rungs: " prefix, which the field name gives
            return check_rungs(rungs)
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("rungs: ")) from None

    @field_validator("reduction_factor")
    @classmethod
    def _rf(cls, value: float) -> float:
        if not (value > 1.0 and math.isfinite(value)):
            raise ValueError("must be > 1")
        return value

    @field_validator("metric", mode="before")
    @classmethod
    def _metric(cls, value: Any) -> Any:
        if value in METRIC_COLUMNS:
            return value
        raise ValueError(f"must be one of {', '.join(METRIC_COLUMNS)} (the smoothed training loss, the validation "
                         f"loss), got {value!r}")

    @field_validator("margin", mode="before")
    @classmethod
    def _margin(cls, value: Any) -> Any:
        if value == "calibrated":
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
        raise ValueError(f"must be 'calibrated' or a finite number >= 0 (a log margin, 0.02 ≈ 2%), got {value!r}")

    def keep_rule(self) -> KeepRule:
        """The rule object these settings name (built by its constructor, which checked them)."""
        return make_rule(self.rule)


# ---------------------------------------------------------------------- failures in Ray's hooks


def guarded(fn: Callable[..., Any], default: Any, strict: bool, *args: Any) -> Any:
    """``fn(*args)`` as a scheduler hook runs it: a broken report contract ends the sweep with its
    message; any other error is logged and ``default`` returned (re-raised when ``strict``, as
    tests set it), so the scheduler never raises into Tune's loop."""
    try:
        return fn(*args)
    except SchedulerContractError as exc:
        # Ray wraps it in a TuneError of ~90 lines with the message at the bottom: say it first,
        # in one line, and let an uncaught one end the user's script with exit status 2.
        announce(exc)
        exit_2_on_uncaught()
        raise
    except Exception:  # noqa: BLE001
        logger.exception("CollapseScheduler: internal error in %s", getattr(fn, "__name__", fn))
        if strict:
            raise
        return default


def notify(callback: Optional[Callable[[dict[str, Any]], None]], payload: dict[str, Any], strict: bool) -> None:
    """Hand ``payload`` to a user callback; what it raises is logged (a display or tracking
    hiccup must not kill the sweep), re-raised when ``strict``."""
    if callback is None:
        return
    try:
        callback(payload)
    except Exception:  # noqa: BLE001
        logger.exception("CollapseScheduler: callback %s failed", getattr(callback, "__name__", callback))
        if strict:
            raise
