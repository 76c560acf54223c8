"""The sweep config: what to train, what to search, how to stop, where to record.

A sweep is a base trainer config (``trainer:``, a ``TrainConfig``) plus a search space over
``lr``, ``batch_size`` and one of ``weight_decay`` or ``tau`` (optionally ``seed``).
The control held fixed is τ by default: every trial derives its own λ = B/(η·τ·D), so the
normalised curves of the sweep share one shape and can be compared early (paper §5).
``trainer.tau: power_lines`` sets τ = 1.084·TPP^−0.527, the Power Lines fit (a THIRD-PARTY
number, see ``predictors.equations.power_lines_tau``).
"""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from hpo.common.overrides import (
    ConfigError,
    apply_overrides,
    check_finite,
    check_safe_name,
    format_validation_error,
    read_yaml,
)
# The scheduler's settings live with the scheduler (one check of them); the sweep config holds them.
from hpo.decisions.scheduler_contract import SchedulerSettings
from predictors.equations import power_lines_tau
from trainers.config import TrainConfig, refuse_bool_number, run_controls

#: MLflow's longest experiment name (its server refuses longer ones with an MlflowException).
MAX_EXPERIMENT_NAME = 500
SEARCHABLE = ("lr", "batch_size", "weight_decay", "tau", "seed")
#: Searched keys whose values must be whole numbers (a seed of 0.5 is not a seed).
INTEGER_KEYS = ("batch_size", "seed")


def merge_trial(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A trial's trainer config: ``base`` with the searched values applied.

    Searching ``weight_decay`` releases a fixed τ (τ then follows λ); searching ``tau``
    replaces a fixed λ. Integer fields arrive as floats from some search spaces.
    """
    merged = copy.deepcopy(base)
    if "weight_decay" in overrides:
        merged.pop("tau", None)
    if "tau" in overrides:
        merged.pop("weight_decay", None)
    merged.update({k: v for k, v in overrides.items() if not str(k).startswith("_")})
    for key in INTEGER_KEYS:
        # Only whole floats (2048.0) become ints; 0.5 stays 0.5 so that validation refuses it
        # instead of training seed 0.
        value = merged.get(key)
        if isinstance(value, float) and value.is_integer():
            merged[key] = int(value)
    return merged


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_bool_number(cls, value, info)


class Dimension(_Strict):
    """One searched hyperparameter: exactly one of ``grid``, ``choice`` or ``loguniform``."""

    grid: Optional[list[float]] = None
    choice: Optional[list[float]] = None
    loguniform: Optional[tuple[float, float]] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Dimension":
        given = [k for k in ("grid", "choice", "loguniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of grid, choice, loguniform")
        values = self.grid if self.grid is not None else self.choice
        if values is not None and len(values) == 0:
            raise ValueError(f"{given[0]} must list at least one value")
        repeated = sorted({v for v in (values or []) if (values or []).count(v) > 1})
        if repeated:  # the same trial trained twice, or a choice weighted without a word
            raise ValueError(f"{given[0]} lists {', '.join(f'{v:g}' for v in repeated)} more than once; "
                             "give each value once (num_samples repeats a whole grid)")
        if self.loguniform is not None:
            low, high = self.loguniform
            if not (0 < low < high) or not math.isfinite(high):
                raise ValueError("loguniform needs 0 < low < high")
        return self

    def extremes(self) -> list[float]:
        """The values to validate against the trainer config before anything runs."""
        return list(self.grid or self.choice or self.loguniform or [])


class SearchSettings(_Strict):
    """How the sweep picks its trial configurations (``hpo.trials.search``).

    ``random`` (default): Ray Tune's variant generator: every grid point, ``choice`` and
    ``loguniform`` values drawn at random, ``num_samples`` times. ``optuna``: Optuna's TPE
    through Ray Tune's searcher API, ``num_samples`` trials in all, each suggested from what
    the finished and stopped trials taught (a stopped trial counts with its predicted final
    loss). ``seed``: repeatable draws (both algorithms). ``max_concurrent``: at most that many
    trials alive at once (paused ones count); with ``optuna`` fewer alive trials means more
    feedback before each suggestion, and unset it is the cluster's trial slots (a trial is
    suggested when a slot frees, not all up front). ``n_startup_trials`` (``optuna`` only):
    the trials drawn at random before TPE models the rest (Optuna's default, 10, when unset).
    """

    algorithm: Literal["random", "optuna"] = "random"
    seed: Optional[int] = None
    max_concurrent: Optional[int] = Field(None, ge=1)
    n_startup_trials: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _startup_needs_optuna(self) -> "SearchSettings":
        if self.n_startup_trials is not None and self.algorithm != "optuna":
            raise ValueError("n_startup_trials: only with algorithm: optuna (random draws every trial)")
        return self


class Resources(_Strict):
    cpu: float = 1.0
    gpu: float = 0.0
    #: Memory of one trial (MB), reserved for it in Ray; every trial's estimated peak must fit.
    #: Unset: a trial's share of this machine (its memory over the trials that run at once).
    memory_mb: Optional[float] = None

    @field_validator("cpu", "gpu")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    @field_validator("memory_mb")
    @classmethod
    def _positive_memory(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and not value > 0:
            raise ValueError("must be > 0 MB")
        return value


class RaySettings(_Strict):
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    max_concurrent_trials: Optional[int] = None

    @field_validator("num_cpus", "max_concurrent_trials")
    @classmethod
    def _at_least_one(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value < 1:
            raise ValueError("must be >= 1 (or null)")
        return value


class MlflowSettings(_Strict):
    tracking_uri: Optional[str] = None  # default: sqlite:///<output>/mlflow.db (absolute)
    experiment: str = "collapse-hpo"

    @field_validator("tracking_uri")
    @classmethod
    def _not_blank(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip():
            raise ValueError("must be a URI or null (the default store in the output directory)")
        return value

    @field_validator("experiment")
    @classmethod
    def _experiment_named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if len(value) > MAX_EXPERIMENT_NAME:  # MLflow refuses it once the sweep has started writing
            raise ValueError(f"{len(value):,} characters; MLflow takes experiment names of at most "
                             f"{MAX_EXPERIMENT_NAME}")
        return value


class MonitorSettings(_Strict):
    """The collapse-residual monitor in a sweep (``hpo.monitor.live``): every trial's residual
    is logged and an alarm printed and tagged; ``stop_on_alarm`` also stops the trial."""

    enabled: bool = True
    stop_on_alarm: bool = False


class Limits(_Strict):
    """Bounds checked before anything starts; raise them to run beyond (``--set
    limits.max_trials=20000``). The scheduler is measured up to 10,000 trials
    (``benchmarks/scheduler_cost.py``); a TPP of 1e12 would train for ever."""

    max_trials: int = Field(10_000, ge=1)
    max_tokens_per_param: float = Field(10_000.0, gt=0)
    #: Fewest optimizer steps a trial may take: below it the rungs see a handful of points and
    #: the curve is no curve (a TPP of 1e-6 trained one step and "completed").
    min_steps: int = Field(50, ge=1)


class SweepConfig(_Strict):
    """A whole sweep, validated. Every error names its field."""

    name: str = "sweep"
    output_dir: Optional[str] = None  # default: runs/<name>
    trainer: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, Dimension] = Field(default_factory=dict, validate_default=True)
    num_samples: int = 1
    search: SearchSettings = Field(default_factory=SearchSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    predictor: Optional[str] = None  # default: the shipped predictor (hpo.data.DEFAULT_PREDICTOR)
    resources: Resources = Field(default_factory=Resources)
    ray: RaySettings = Field(default_factory=RaySettings)
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    limits: Limits = Field(default_factory=Limits)

    @field_validator("output_dir")
    @classmethod
    def _output_named(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip():  # "" would silently mean runs/<name>
            raise ValueError("empty path; name a folder, or leave output_dir out for runs/<name>")
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The name is a directory under <output>/ray: '../x' would put the Ray experiment
        # (tuner.pkl, checkpoints) outside the output directory.
        return check_safe_name(value)

    @field_validator("search_space")
    @classmethod
    def _known_keys(cls, space: dict[str, Dimension]) -> dict[str, Dimension]:
        if not space:  # nothing searched: one trial of the base config, no sweep at all
            raise ValueError(f"empty; search at least one of {list(SEARCHABLE)} (e.g. lr: {{grid: [0.005, 0.01]}})")
        unknown = sorted(set(space) - set(SEARCHABLE))
        if unknown:
            raise ValueError(f"cannot search {unknown}; searchable keys are {list(SEARCHABLE)}")
        if "tau" in space and "weight_decay" in space:
            raise ValueError("search one of weight_decay or tau, not both")
        for key in INTEGER_KEYS:
            dim = space.get(key)
            if dim is None:
                continue
            if dim.loguniform is not None:
                raise ValueError(f"{key}: a whole number; search it with grid or choice, not loguniform")
            fractional = [v for v in (dim.grid or dim.choice or []) if not float(v).is_integer()]
            if fractional:
                raise ValueError(f"{key}: values must be whole numbers, got {fractional}")
        return space

    @field_validator("num_samples")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be >= 1")
        return value

    @model_validator(mode="after")
    def _search_fits_space(self) -> "SweepConfig":
        if self.search.algorithm == "optuna":
            grids = [k for k, d in self.search_space.items() if d.grid is not None]
            if grids:
                # A model-based searcher samples; an enumerated grid leaves it nothing to choose.
                raise ValueError(f"search.algorithm: optuna samples each dimension; give {grids[0]} as "
                                 "choice (or loguniform) instead of grid, or use algorithm: random")
            if not self.search_space:
                raise ValueError("search.algorithm: optuna needs a search_space to search")
        return self

    # -- derived ---------------------------------------------------------------------

    def output_given(self) -> str:
        """The output folder as configured (``runs/<name>`` by default), before resolving links."""
        return self.output_dir or f"runs/{self.name}"

    def output_path(self) -> Path:
        return Path(self.output_given()).resolve()

    def predictor_path(self) -> Path:
        """The sweep's predictor: the one named, else the packaged one fitted on the sweep's metric
        nearest the model's size (``hpo.data.default_predictor_path``)."""
        from hpo.data import default_predictor_path

        return (Path(self.predictor).resolve() if self.predictor
                else default_predictor_path(self.n_params(), self.scheduler.metric))

    def n_params(self) -> Optional[int]:
        """N (non-embedding) of the base trainer's model; None where the trainer section does not
        make a model config (a user's own trainable reports N itself)."""
        try:
            return int(TrainConfig.model_validate(self.base_trainer()).model.n_params)
        except Exception:  # noqa: BLE001 - an invalid trainer section is reported by its own check
            return None

    def tracking_uri(self) -> str:
        if self.mlflow.tracking_uri:
            return self.mlflow.tracking_uri
        return f"sqlite:///{self.output_path() / 'mlflow.db'}"

    def base_trainer(self) -> dict[str, Any]:
        """The trainer section with ``tau: power_lines`` resolved to a number."""
        base = copy.deepcopy(self.trainer)
        if self.scheduler.metric == "val_loss" and base.get("eval_every") is None:
            # Deciding on the validation loss: every report carries one (a report without it
            # would read as a diverged trial).
            base["eval_every"] = base.get("log_every", TrainConfig.model_fields["log_every"].default)
        if base.get("tau") == "power_lines":
            tpp = base.get("tokens_per_param", TrainConfig.model_fields["tokens_per_param"].default)
            base["tau"] = power_lines_tau(float(tpp))
        return base

    def trial_trainer(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The trainer config of one trial: the base with the searched values applied.

        Searching ``weight_decay`` releases the fixed τ (τ then varies with λ); searching
        ``tau`` overrides it.
        """
        return merge_trial(self.base_trainer(), overrides)


def check_dense_validation(trainers: list[dict[str, Any]], source: str, field: str = "scheduler.metric") -> None:
    """Deciding on (or fitting) the validation loss needs one at every report: the trainer
    evaluates every ``eval_every`` steps, at a log boundary, so ``eval_every`` <= ``log_every``
    puts a val_loss in every report. Refuse, in one line, a trainer config that would report
    without one."""
    default_log = TrainConfig.model_fields["log_every"].default
    for trainer in trainers:
        every, log = trainer.get("eval_every"), trainer.get("log_every", default_log)
        if every is None or (isinstance(every, (int, float)) and isinstance(log, (int, float)) and every > log):
            raise ConfigError(f"{source}: {field}: val_loss needs a validation loss at every report; set "
                              f"trainer.eval_every to at most trainer.log_every ({log}) or leave it out, got {every}")


def load_sweep_config(path: Union[str, Path, None] = None, *, data: Optional[dict] = None,
                      overrides: tuple[str, ...] = (), source: Optional[str] = None) -> SweepConfig:
    """Read, override and validate a sweep config; raise ``ConfigError`` naming the field.

    Every trial configuration the search space can produce (all grid/choice values, the
    ends of log-uniform ranges) is validated as a ``TrainConfig`` here, before any process
    starts or any file is written.
    """
    source = source or (str(path) if path is not None else "sweep config")
    raw = read_yaml(str(path)) if path is not None else copy.deepcopy(data or {})
    raw = apply_overrides(raw, overrides)
    check_finite(raw, source)
    try:
        config = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
    if config.base_trainer().get("tau") == "power_lines":  # pragma: no cover - resolved above
        raise ConfigError(f"{source}: trainer.tau: power_lines could not be resolved")
    if config.scheduler.metric == "val_loss":
        check_dense_validation([config.base_trainer()], source)
    grid = math.prod(len(d.grid) for d in config.search_space.values() if d.grid is not None)
    if config.num_samples * grid > config.limits.max_trials:
        raise ConfigError(f"{source}: num_samples: {config.num_samples} x {grid} grid point(s) = "
                          f"{config.num_samples * grid:,} trials, above limits.max_trials {config.limits.max_trials:,} "
                          "(raise limits.max_trials to run them)")
    names = list(config.search_space)
    for values in itertools.product(*(config.search_space[n].extremes() for n in names)):
        overrides_i = {n: (int(v) if n in INTEGER_KEYS else v) for n, v in zip(names, values)}
        try:
            trial = TrainConfig.model_validate(config.trial_trainer(overrides_i))
        except ValidationError as exc:
            where = ", ".join(f"{n}={v}" for n, v in overrides_i.items()) or "base config"
            raise ConfigError(
                format_validation_error(exc, f"{source}: trainer (trial {where})")
            ) from None
        steps = run_controls(trial).total_steps
        if steps < config.limits.min_steps:
            where = ", ".join(f"{n}={v:g}" if isinstance(v, float) else f"{n}={v}" for n, v in overrides_i.items())
            raise ConfigError(f"{source}: trainer.tokens_per_param: {trial.tokens_per_param:g} gives trial {where} "
                              f"{steps:,} optimizer step(s) of {trial.batch_size:,} tokens, below limits.min_steps "
                              f"{config.limits.min_steps} (train longer, or lower batch_size)")
        if trial.tokens_per_param > config.limits.max_tokens_per_param:
            raise ConfigError(f"{source}: trainer.tokens_per_param: {trial.tokens_per_param:g} is above "
                              f"limits.max_tokens_per_param {config.limits.max_tokens_per_param:g} "
                              "(raise limits.max_tokens_per_param to train that long)")
    return config
