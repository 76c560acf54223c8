"""``hpo calibrate``: run reference curves through Ray Tune, bank them, fit the predictor.

A calibration is a base trainer config plus a grid (cartesian product over trainer fields,
typically τ × TPP × LR or batch size, on the decay-to-zero schedule) and seeds. Runs whose
resolved config is already in the curve bank are skipped, so re-running a calibration only
trains what is missing (:mod:`hpo.calibration.banking`, the only part that needs Ray and torch, imported
only then); ``--fit-only`` refits from the bank alone and ``--from-curves`` fits a user's
curves, neither of which imports Ray or torch. This module holds the configuration and the
command; the fit is :mod:`hpo.calibration.fit`, its report :mod:`hpo.calibration.report`.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hpo.calibration.fit import FitSettings, fit_and_report
from hpo.calibration.memory import check_fit_memory, check_fit_time
from hpo.trials.curve_bank import bank_curves, fill_epochs, load_bank, run_id_of
from hpo.common.output_lock import hold_folder
from hpo.common.overrides import ConfigError, apply_overrides, format_validation_error, read_yaml
from hpo.common.paths import PathError, check_input_file, check_output_dir, check_output_file
from hpo.trials.sweep_config import check_dense_validation, merge_trial
from predictors.run_keys import METRIC_COLUMNS


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One run of a named sweep: a configuration (``label``) in one replicate seed."""

    sweep: str
    label: str
    seed: int
    run_id: str


class CalibrationConfig(BaseModel):
    """A calibration: base trainer, grid, seeds, where the bank and predictor go."""

    model_config = ConfigDict(extra="forbid")
    name: str = "calibration"
    trainer: dict[str, Any] = Field(default_factory=dict)
    # One grid (a mapping of trainer field → values, expanded as a cartesian product) or a
    # list of grids whose runs are pooled; a grid may list `seed` itself, else `seeds` apply.
    grid: Union[dict[str, list[Any]], list[dict[str, list[Any]]]] = Field(default_factory=dict)
    # Named grids (for example the audit sweeps: name → grid), pooled with `grid` for training;
    # a run shared by several sweeps is trained once. Evaluation scripts read the names.
    sweeps: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0])
    # Replicates independent in data order too: each run's data.data_seed = its seed. Within
    # one seed every run still sees the same stream (paired comparisons).
    data_seed_from_seed: bool = False
    bank: str = "configs/calibration/bank.parquet"
    # Other banks read (never written) for this calibration's runs: a calibration pooling the
    # runs of several (the default bank with the width ladder's). Runs still missing are
    # trained into `bank`.
    extra_banks: list[str] = Field(default_factory=list)
    # Banks of sweeps at scales this calibration does not fit (other model sizes, TPPs): the
    # predictor as fitted predicts their sweeps, and the order error measured there is what a
    # sweep as far off the calibrated scale gets (issue 25). Their curves never enter the fit.
    ranking_banks: list[str] = Field(default_factory=list)
    # Banks of sweeps on other corpora than this calibration's: the order error the keep rule
    # reads is measured there (a user's sweep is on a corpus the fit never saw), not within the
    # calibration's own corpus. Their curves never enter the fit.
    corpus_banks: list[str] = Field(default_factory=list)
    # None: bank the curves only, fit and write nothing (held-out studies such as transfer).
    # Beside its calibration report by default ({output_dir}: the report folder, default
    # runs/calibration/<name>; {name}: the calibration's name): never a tracked file unless asked.
    predictor_out: Optional[str] = "{output_dir}/predictor.json"
    output_dir: Optional[str] = None
    fit: FitSettings = Field(default_factory=FitSettings)
    # The loss the predictor is fitted on (predictors.run_keys.METRIC_COLUMNS), recorded in the
    # predictor file: "loss", the smoothed training loss; "val_loss", the loss on the fixed
    # held-out windows, which needs runs evaluated at every report (trainer eval_every <=
    # log_every). A sweep refuses a predictor fitted on another metric than its scheduler.metric.
    metric: Literal["loss", "val_loss"] = "loss"
    cpus_per_run: float = 1.0
    num_cpus: Optional[int] = None
    mlflow_experiment: str = "collapse-hpo-calibration"

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, grid: Any) -> Any:
        for one in grid if isinstance(grid, list) else [grid]:
            cls._check_grid(one)
        return grid

    @field_validator("sweeps")
    @classmethod
    def _non_empty_sweeps(cls, sweeps: Any) -> Any:
        for one in sweeps.values():
            cls._check_grid(one)
        return sweeps

    @staticmethod
    def _check_grid(one: dict[str, Any]) -> None:
        for key, values in one.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{key}: list at least one value")

    def grids(self) -> list[dict[str, list[Any]]]:
        """The unnamed grids then the named sweeps' grids, in file order."""
        unnamed = self.grid if isinstance(self.grid, list) else [self.grid]
        return [g for g in unnamed if g] + list(self.sweeps.values())

    def runs(self, grids: Optional[list[dict[str, list[Any]]]] = None) -> list[dict[str, Any]]:
        """Every resolved trainer config of ``grids`` (default: all of the calibration's),
        validated, duplicates removed."""
        from trainers.config import TrainConfig

        configs: dict[str, dict[str, Any]] = {}
        for grid in self.grids() if grids is None else grids:
            grid = dict(grid) if "seed" in grid else {**grid, "seed": list(self.seeds)}
            keys = list(grid)
            for values in itertools.product(*(grid[k] for k in keys)):
                overrides = dict(zip(keys, values))
                trainer = merge_trial(self.trainer, overrides)
                if self.data_seed_from_seed:
                    trainer["data"] = {**trainer.get("data", {}), "data_seed": trainer.get("seed", 0)}
                try:
                    validated = TrainConfig.model_validate(trainer)
                except ValidationError as exc:
                    where = ", ".join(f"{k}={v}" for k, v in overrides.items())
                    raise ConfigError(format_validation_error(exc, f"calibration trainer ({where})")) from None
                resolved = validated.model_dump(mode="json")
                configs.setdefault(run_id_of(resolved), resolved)
        return list(configs.values())


    def sweep_runs(self) -> list[SweepRun]:
        """Every (named sweep, configuration, seed) with the bank run_id it gets.

        Each combination is resolved through :meth:`runs`, so the run_id is exactly the one
        the calibration banks; a run shared by two sweeps appears in both.
        """
        out = []
        for sweep, grid in self.sweeps.items():
            keys = [k for k in grid if k != "seed"]
            # Label by the keys that vary (a one-value key such as weight_decay: [0.4] is context).
            shown = [k for k in keys if len(grid[k]) > 1] or keys
            for values in itertools.product(*(grid[k] for k in keys)):
                point = dict(zip(keys, values))
                label = ", ".join(f"{k}={point[k]:g}" if isinstance(point[k], (int, float)) else f"{k}={point[k]}"
                                  for k in shown)
                for seed in grid.get("seed", self.seeds):
                    (resolved,) = self.runs([{**{k: [v] for k, v in point.items()}, "seed": [seed]}])
                    out.append(SweepRun(sweep, label, int(seed), run_id_of(resolved)))
        return out


def load_calibration_config(path: str, overrides: tuple[str, ...] = ()) -> CalibrationConfig:
    raw = apply_overrides(read_yaml(path), overrides)
    try:
        config = CalibrationConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path)) from None
    runs = config.runs()  # validate every run before anything starts
    if config.metric == "val_loss":
        check_dense_validation(runs, path, field="metric")  # the sweep's check (one home)
    return config


def _resolve(path: str) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (Path.cwd() / candidate).resolve()


def portable_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies inside it (a repository's
    ``configs/calibration/default_bank.parquet``), else as given: a predictor file shipped to
    other machines should not carry this machine's absolute paths."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _output(config: CalibrationConfig) -> Path:
    return _resolve(config.output_dir or f"runs/calibration/{config.name}")


def _predictor_out_given(config: CalibrationConfig) -> str:
    assert config.predictor_out is not None
    return config.predictor_out.replace("{output_dir}", str(_output(config))).replace("{name}", config.name)


def _predictor_out(config: CalibrationConfig) -> Path:
    return _resolve(_predictor_out_given(config))


def preflight_outputs(config: CalibrationConfig) -> None:
    """Where the calibration writes (its report folder, its predictor file), checked before any
    curve is read or any run trained: a predictor path that is a folder, lies under a file or
    cannot be written used to fail after the whole fit, leaving the report folder behind."""
    check_output_dir(config.output_dir if config.output_dir is not None else f"runs/calibration/{config.name}",
                     "output_dir (--output-dir)")
    if config.predictor_out is not None:
        if not config.predictor_out.strip():
            raise ConfigError("predictor_out (--predictor-out): empty path; name a file, or null to bank only")
        check_output_file(_predictor_out_given(config), "predictor_out (--predictor-out)")


def preflight_bank(config: CalibrationConfig) -> None:
    """An existing ``bank`` must be a parquet file (not a system file, a FIFO, /proc, or text):
    checked before the output folder is made (``bank: /etc/passwd`` left an empty
    ``runs/calibration/<name>/`` behind its error)."""
    path = _resolve(config.bank)
    if not path.exists() and not path.is_symlink():
        return  # a new bank: created by the runs it banks (or named by the fit's own error)
    try:
        check_input_file(path, "bank", what="curve bank")
        import pyarrow.parquet as pq

        pq.read_metadata(path)
    except PathError as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - pyarrow's own refusal: not a parquet file
        raise ConfigError(f"bank: {path}: not a parquet curve bank ({' '.join(str(exc).split())[:160]})") from None


def fit_from_bank(config: CalibrationConfig, bank_path: Path, predictor_path: Path) -> dict[str, Any]:
    """Fit the predictor on the bank's (and ``extra_banks``') completed curves of this
    calibration; write JSON + report."""
    frame = _banked_runs(config, bank_path)
    wanted = {run_id_of(c) for c in config.runs()}
    column = METRIC_COLUMNS[config.metric]
    provenance: dict[str, Any] = {"calibration": config.name, "bank": portable_path(bank_path), "metric": config.metric}
    if config.extra_banks:
        provenance["extra_banks"] = [portable_path(_resolve(b)) for b in config.extra_banks]
    ranking_curves = []
    for extra in config.ranking_banks:
        path = _resolve(extra)
        if not path.is_file():
            raise ConfigError(f"ranking_banks: {extra}: no such bank")
        extra_frame = load_bank(path)
        if path == bank_path:  # the calibration's own bank: only the runs it does not fit
            extra_frame = extra_frame[~extra_frame["run_id"].isin(wanted)]
        ranking_curves += bank_curves(extra_frame, loss_column=column)
    if config.ranking_banks:
        provenance["ranking_banks"] = [portable_path(_resolve(b)) for b in config.ranking_banks]
    corpus_curves = []
    for other in config.corpus_banks:
        path = _resolve(other)
        if not path.is_file():
            raise ConfigError(f"corpus_banks: {other}: no such bank")
        corpus_curves += bank_curves(load_bank(path), loss_column=column)
    if config.corpus_banks:
        provenance["corpus_banks"] = [portable_path(_resolve(b)) for b in config.corpus_banks]
    return fit_and_report(bank_curves(fill_epochs(frame), loss_column=column), config.fit, predictor_path, _output(config),
                          provenance=provenance, source=str(bank_path), ranking_curves=ranking_curves,
                          corpus_curves=corpus_curves, corpora=[Path(b).stem for b in config.corpus_banks])


def _banked_runs(config: CalibrationConfig, bank_path: Path) -> pd.DataFrame:
    """This calibration's runs in ``bank_path`` and its ``extra_banks`` (a run in several: the
    first bank's copy)."""
    wanted = {run_id_of(c) for c in config.runs()}
    frames = []
    for path in [bank_path, *(_resolve(b) for b in config.extra_banks)]:
        if path != bank_path and not path.is_file():
            raise ConfigError(f"extra_banks: {portable_path(path)}: no such bank")
        frame = load_bank(path)
        seen = set().union(*(set(f["run_id"]) for f in frames)) if frames else set()
        frames.append(frame[frame["run_id"].isin(wanted - seen)])
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]



def calibrate(config_path: str, overrides: tuple[str, ...] = (), fit_only: bool = False) -> dict[str, Any]:
    """``hpo calibrate CONFIG``: bank the runs (unless ``fit_only``), fit, report; under the
    output folder's lock (``hpo.common.output_lock``): two calibrations into one folder would break
    its ``mlflow.db``."""
    config = load_calibration_config(config_path, overrides)
    preflight_outputs(config)
    preflight_bank(config)
    with hold_folder(_output(config), "hpo calibrate"):
        return _calibrate(config, fit_only)


def _calibrate(config: CalibrationConfig, fit_only: bool) -> dict[str, Any]:
    bank_path = _resolve(config.bank)
    if not fit_only:
        from hpo.calibration.banking import run_reference_curves  # Ray and torch: only when runs are trained

        elsewhere = {r for b in config.extra_banks if _resolve(b).is_file() for r in load_bank(_resolve(b))["run_id"]}
        todo = [c for c in config.runs() if run_id_of(c) not in elsewhere]  # banked in an extra bank: not retrained
        added = run_reference_curves(todo, bank_path, config.name, storage=_output(config) / "ray",
                                     num_cpus=config.num_cpus, cpus_per_run=config.cpus_per_run)
        print(f"calibration: banked {added} new curves in {bank_path}")
    if config.predictor_out is None:
        frame = _banked_runs(config, bank_path)
        wanted = {run_id_of(c) for c in config.runs()}
        n = int(frame["run_id"].nunique()) if len(frame) else 0
        print(f"calibration {config.name!r}: bank only (predictor_out is null); "
              f"{n} of {len(wanted)} runs in {bank_path}")
        return {"bank": str(bank_path), "n_banked": n, "n_runs": len(wanted), "predictor": None}
    predictor_path = _predictor_out(config)
    summary = fit_from_bank(config, bank_path, predictor_path)
    _log_mlflow(config, summary)
    return summary


def user_curves_config(label: str, config_path: Optional[str] = None,
                       overrides: tuple[str, ...] = ()) -> CalibrationConfig:
    """The calibration settings for a user's own curves: ``config_path``'s (its name, fit,
    predictor_out, output_dir, MLflow experiment; its grid is ignored) or, without one, a
    calibration named ``label`` fitted as the shipped predictor is (t̂ ∈ [0.05, 1], m fitted)
    writing its predictor beside its report (``<output_dir>/predictor.json``, default
    ``runs/calibration/<label>/``)."""
    raw = read_yaml(config_path) if config_path else {"name": label, "fit": {"t_min": 0.05}}
    raw = apply_overrides(raw, overrides)
    try:
        return CalibrationConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, config_path or "calibration settings")) from None


def calibrate_from_curves(imported: Any, config: CalibrationConfig) -> dict[str, Any]:
    """The same fit, calibration report, predictor JSON and MLflow record as for banked runs,
    on curves from ``hpo.calibration.curve_import`` (a user's file or MLflow experiment)."""
    if config.predictor_out is None:
        raise ConfigError("predictor_out: a calibration from curves must write a predictor (got null)")
    preflight_outputs(config)  # also checked by `hpo calibrate` before the curves were read
    check_fit_memory(len(imported.curves), imported.source)  # before the lock file or any fit
    check_fit_time(len(imported.curves), imported.source, config.fit.held_out_error)
    predictor_path = _predictor_out(config)
    with hold_folder(_output(config), "hpo calibrate"):
        summary = fit_and_report(list(imported.curves), config.fit, predictor_path, _output(config),
                                 provenance={"calibration": config.name, "curves": imported.source,
                                             "metric": config.metric},
                                 source=imported.source, notes=tuple(imported.notes))
        _log_mlflow(config, summary)
    return summary


def _log_mlflow(config: CalibrationConfig, summary: dict[str, Any]) -> None:
    """Record the calibration in a local MLflow store next to its report."""
    from mlflow.tracking import MlflowClient

    out = _output(config)
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(config.mlflow_experiment)
    experiment_id = (experiment.experiment_id if experiment else client.create_experiment(
        config.mlflow_experiment, artifact_location=(out / "mlartifacts").as_uri()))
    run = client.create_run(experiment_id, run_name=config.name, tags={"collapse_hpo.kind": "calibration"})
    client.log_param(run.info.run_id, "n_curves", summary["n_curves"])
    client.log_param(run.info.run_id, "chosen_mode", summary["chosen_mode"])
    client.log_param(run.info.run_id, "size_method", summary["modes"][summary["chosen_mode"]].get("size_method"))
    for mode, info in summary["modes"].items():
        key = "five_param" if mode.startswith("five") else "paper"
        client.log_metric(run.info.run_id, f"{key}_fit_mae", info["fit_mae"])
        client.log_metric(run.info.run_id, f"{key}_oracle_mae", info["oracle_mae"])
    for name in ("calibration.json", "calibration.md", "normalized.png"):
        if (out / name).exists():
            client.log_artifact(run.info.run_id, str(out / name))
    client.log_artifact(run.info.run_id, summary["predictor"])
    client.set_terminated(run.info.run_id)


def __getattr__(name: str) -> Any:
    """``hpo.calibration.calibrate.CalibrationTrainable`` resolves lazily to ``hpo.calibration.banking``'s, so Ray
    experiments pickled before the trainable moved there still restore, without this module
    importing Ray."""
    if name in ("CalibrationTrainable", "CurveCollector", "run_reference_curves"):
        from hpo.calibration import banking

        return getattr(banking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
