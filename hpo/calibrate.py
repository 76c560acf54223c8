"""``hpo calibrate``: run reference curves through Ray Tune, bank them, fit the predictor.

A calibration is a base trainer config plus a grid (cartesian product over trainer fields,
typically τ × TPP × LR or batch size, on the decay-to-zero schedule) and seeds. Runs whose
resolved config is already in the curve bank are skipped, so re-running a calibration only
trains what is missing (:mod:`hpo.banking`, the only part that needs Ray and torch, imported
only then); ``--fit-only`` refits from the bank alone and ``--from-curves`` fits a user's
curves, neither of which imports Ray or torch.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hpo import held_out
from hpo.curve_bank import bank_curves, fill_epochs, load_bank, run_id_of
from hpo.output_lock import hold_folder
from hpo.overrides import ConfigError, apply_overrides, format_validation_error, read_yaml
from hpo.sweep_config import merge_trial
from hpo.tables import markdown_table
from predictors import equations, fit
from predictors.references import ReferenceCurves
from predictors.io import atomic_write_bytes, atomic_write_json, atomic_write_text, dumps


class FitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    t_min: float = Field(0.2, ge=0, lt=1)
    fit_m: bool = True
    compare_fixed_m: bool = True  # also fit the paper's fixed-m mode and report both
    # Measure the decision-fraction error leave-one-out (one refit per curve) instead of in-sample.
    held_out_error: bool = True
    # Also measure it across scales (leave-one-TPP-out, leave-one-size-out where the bank has
    # two or more): the error the predictor states for runs away from the calibrated scale.
    cross_scale_error: bool = True
    # Fit the irreducible loss L̂ of Eq. 1 (ℓ = (L − L̂)/(L(1) − L̂)); the paper's L̂ = 0 otherwise.
    irreducible_loss: bool = False
    # Measure how reliably the predictor orders the trials of one sweep, per kind of sweep
    # (leave-one-sweep-out; across scales too): what the scheduler's calibrated margin uses.
    ranking_error: bool = True
    # How model size enters the prediction (issue 15): "choose" compares the plain surrogate,
    # the size term m(N) and reference curves leave-one-size-out where the bank spans sizes
    # (the size term, fitted only then, without held-out errors); or one of them by name.
    size_method: Literal["choose", "surrogate", "size term", "reference curves",
                         "reference curves, size-term trend"] = "choose"
    # Also refit on the values up to (down from) each TPP, size and τ and predict every value
    # beyond: the far distances the error off the calibrated scale is grown from.
    extrapolation_error: bool = True


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
    # None: bank the curves only, fit and write nothing (held-out studies such as transfer).
    # Beside its calibration report by default ({output_dir}: the report folder, default
    # runs/calibration/<name>; {name}: the calibration's name): never a tracked file unless asked.
    predictor_out: Optional[str] = "{output_dir}/predictor.json"
    output_dir: Optional[str] = None
    fit: FitSettings = Field(default_factory=FitSettings)
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
    config.runs()  # validate every run before anything starts
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


def _predictor_out(config: CalibrationConfig) -> Path:
    assert config.predictor_out is not None
    return _resolve(config.predictor_out.replace("{output_dir}", str(_output(config))).replace("{name}", config.name))


def fit_from_bank(config: CalibrationConfig, bank_path: Path, predictor_path: Path) -> dict[str, Any]:
    """Fit the predictor on the bank's (and ``extra_banks``') completed curves of this
    calibration; write JSON + report."""
    frame = _banked_runs(config, bank_path)
    wanted = {run_id_of(c) for c in config.runs()}
    provenance: dict[str, Any] = {"calibration": config.name, "bank": portable_path(bank_path)}
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
        ranking_curves += bank_curves(extra_frame)
    if config.ranking_banks:
        provenance["ranking_banks"] = [portable_path(_resolve(b)) for b in config.ranking_banks]
    return fit_and_report(bank_curves(fill_epochs(frame)), config.fit, predictor_path, _output(config),
                          provenance=provenance, source=str(bank_path), ranking_curves=ranking_curves)


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


def fit_and_report(
    curves: list, settings: FitSettings, predictor_path: Path, out: Path, *,
    provenance: dict[str, Any], source: str, notes: tuple[str, ...] = (), ranking_curves: Sequence[Any] = (),
) -> dict[str, Any]:
    """The one calibration fit, for banked runs and for a user's own curves alike.

    Leaves out (with a note) curves that do not reach the end of training; for each mode,
    chooses how model size enters the prediction (leave-one-size-out, where the bank spans
    sizes), fits, measures the decision error leave-one-out and per held-out group across
    scales and the coverage of the intervals it states; writes the predictor JSON,
    ``calibration.json``/``.md`` and the normalised-curve plot to ``out``. Prints progress
    through the held-out refits. Raises ``ConfigError`` naming ``source`` when fewer than 3
    complete curves remain.
    """
    curves, left_out = complete_curves(curves)
    notes = list(notes) + left_out
    if len(curves) < 3:
        raise ConfigError(f"{source}: only {len(curves)} complete curves to calibrate on (need 3)"
                          + (f"; {'; '.join(notes)}" if notes else ""))
    provenance = {**provenance,
                  "corpus_hash": sorted(set(str(c.meta.get("corpus_hash")) for c in curves))}
    results: dict[bool, Any] = {}
    held: dict[bool, dict[str, Any]] = {}
    choices: dict[bool, Any] = {}
    methods: dict[bool, held_out.Method] = {}
    refits = held_out.Refits(curves)  # shared: the size comparison's refits serve the error tables too
    modes = [True, False] if settings.compare_fixed_m else [settings.fit_m]
    measured = settings.held_out_error and len(curves) >= 4
    for fit_m in modes:
        base = {"t_min": settings.t_min, "fit_m": fit_m, "fit_irreducible": settings.irreducible_loss}
        label = "five-parameter" if fit_m else "paper (m = 0.05)"
        candidates = {m.name: m for m in held_out.size_methods(base)}
        if settings.size_method == "choose" and measured:
            _progress(f"{label}: how model size enters the prediction (leave-one-size-out)")
            choices[fit_m] = held_out.choose_size_method(curves, fit_kwargs=base, refits=refits, progress=_progress)
            method = choices[fit_m].chosen
        else:
            # Without held-out refits: the size term (fitted only where the bank spans sizes).
            method = candidates["size term" if settings.size_method == "choose" else settings.size_method]
        methods[fit_m] = method
        result = fit(curves, **method.fit_kwargs,
                     provenance={**provenance, "mode": "five-parameter" if fit_m else "paper (m fixed)",
                                 "size_method": method.name})
        if method.references is not None:
            refs = ReferenceCurves.from_curves(curves, extrapolation=method.references)  # type: ignore[arg-type]
            result = dataclasses.replace(result, predictor=dataclasses.replace(result.predictor, references=refs))
        held[fit_m] = {}
        if measured:
            # The in-sample decision error is optimistic; the predictor ships the held-out one.
            _progress(f"{label}, {method.name}: held-out decision error")
            loo = held_out.leave_one_out(curves, method=method, refits=refits, progress=_progress)
            cross = (held_out.across_scales(curves, method=method, refits=refits, progress=_progress,
                                            extrapolate=settings.extrapolation_error)
                     if settings.cross_scale_error else [])
            table = held_out.decision_error_table(loo, cross)
            result = dataclasses.replace(
                result, predictor=dataclasses.replace(result.predictor, decision_error=table))
            held[fit_m] = {"leave-one-out": loo, "cross": cross}
        results[fit_m] = result
    chosen_mode = _choose_mode(results, settings.fit_m)
    chosen = results[chosen_mode]
    ranking = None
    if measured and settings.ranking_error:
        ranking = held_out.ranking_error_table(curves, method=methods[chosen_mode], refits=refits,
                                               cross=held[chosen_mode].get("cross", []), progress=_progress)
        if ranking is not None:
            complete_extra = complete_curves(list(ranking_curves))[0]
            if complete_extra:
                _progress(f"ranking error on {len(complete_extra)} curves of the ranking banks (never fitted)")
            extra_groups = held_out.evaluation_groups(chosen.predictor, complete_extra) if complete_extra else ()
            noise = held_out.seed_noise(curves)
            ranking = dataclasses.replace(ranking, cross_groups=(*ranking.cross_groups, *extra_groups),
                                          seed_noise=None if noise is None else noise[0],
                                          seed_noise_source=None if noise is None else noise[1])
        chosen = dataclasses.replace(chosen, predictor=dataclasses.replace(chosen.predictor, ranking_error=ranking))
        results[chosen_mode] = chosen
        if ranking is None:
            notes.append("ranking error not measured: the bank holds no sweep (curves that differ in "
                         "only one of η, B, λ at one TPP, size and seed)")
    band = monitor_band(curves, chosen.predictor)
    if band is None:
        notes.append("monitor band not measured: fewer than 3 complete curves the predictor covers")
    else:
        chosen = dataclasses.replace(chosen, predictor=dataclasses.replace(chosen.predictor, monitor=band))
        results[chosen_mode] = chosen
    # Everything is computed before anything is written (issue 28): a report or figure that fails
    # leaves no predictor file a user could take for a finished calibration. The predictor goes
    # last, so it exists only once its report and figure do.
    summary = _calibration_summary(curves, results, chosen_mode, held, notes, choices)
    report = calibration_markdown(summary)
    figure = _render_normalized(curves, chosen.predictor)
    predictor_json = dumps(chosen.predictor.to_dict()) + "\n"
    # Strict JSON: a coverage or error that could not be measured is null, never a bare NaN.
    atomic_write_json(out / "calibration.json", summary)
    atomic_write_text(out / "calibration.md", report)
    atomic_write_bytes(out / "normalized.png", figure)
    atomic_write_text(predictor_path, predictor_json)
    summary["predictor"] = str(predictor_path)
    summary["report_dir"] = str(out)
    return summary


def monitor_band(curves: list, predictor: Any) -> Any:
    """The collapse-residual noise band (``predictors.monitor``) of the clean calibration curves
    against the fitted predictor, in-sample: the predictor's ``monitor`` section. None when
    fewer than 3 curves are covered (scripts/add_monitor_band.py adds the same section to a shipped file)."""
    from predictors.monitor import calibrate_band

    try:
        return calibrate_band(curves, predictor, source=f"{len(curves)} clean calibration curves, "
                                                       "residual against the fitted predictor (in-sample)")
    except ValueError:
        return None


def _progress(message: str) -> None:
    print(f"  {message}", flush=True)


def complete_curves(curves: list) -> tuple[list, list[str]]:
    """The curves that reach the end of training (t̂ ≥ 0.99), and a note for each left out
    (a run whose non-finite tail the bank dropped, or one stopped early)."""
    complete, notes = [], []
    for curve in curves:
        if float(curve.t_hat[-1]) < 0.99:
            notes.append(f"run {curve.meta.get('name', '?')}: ends at t̂ = {float(curve.t_hat[-1]):.3g} "
                         "(non-finite tail or stopped early); left out of the fit")
        else:
            complete.append(curve)
    return complete, notes


def _choose_mode(results: dict[bool, Any], preferred: bool) -> bool:
    """Pick the mode with the lower decision-fraction error (mean over fractions), if known."""
    if len(results) == 1:
        return next(iter(results))

    def score(result: Any) -> float:
        table = result.predictor.decision_error
        if table is None:
            return float(result.fit_mae)
        # Judge by the error of the final loss predicted at the decision fractions (≤ 0.3).
        errors = [e for s, e in zip(table.stop_fractions, table.rel_error) if s <= 0.3 + 1e-9]
        return float(np.mean(errors or list(table.rel_error)))

    return min(results, key=lambda mode: (score(results[mode]), mode != preferred))


def _coverage(held: dict[str, Any], table: Any) -> dict[str, Any]:
    """Coverage of the stated ±1σ/±2σ intervals on the held-out predictions of one mode.

    Leave-one-out predictions are judged with the in-scale e(s) the predictor states for runs
    at its scale; each cross-scale grouping with both the in-scale e(s) (what a predictor
    without a cross-scale error would state) and the cross-scale e(s) the predictor states now
    (per held-out group, from the error model of the *other* groups: ``held_out.group_coverage``)."""
    if not held or table is None:
        return {}
    fractions = list(table.stop_fractions)

    def stated(values: Any) -> list[float]:
        return [float(np.interp(s, fractions, values)) for s in held["leave-one-out"].fractions]

    out = {"leave-one-out": held_out.coverage_table(held["leave-one-out"], {"in-scale e(s)": stated(table.rel_error)})}
    for cross in held["cross"]:
        labels = held_out.coverage_table(cross, {"in-scale e(s)": stated(table.rel_error)})
        if table.groups:
            by_z = {z: [r for r in held_out.group_coverage(table, [cross], z) if r["scheme"] == cross.scheme]
                    for z in (1.0, 2.0)}
            labels["cross-scale e(s)"] = {
                f"{s:g}": {f"{z:g}σ": _pooled(rows, f"{s:g}", f"{z:g}σ") for z, rows in by_z.items()}
                for s in fractions}
        out[cross.scheme] = labels
    return out


def _pooled(rows: list[dict[str, Any]], s: str, key: str) -> float:
    """Coverage pooled over held-out groups (weighted by their predictions)."""
    n = sum(r["by_s"][s]["n"] for r in rows if s in r["by_s"])
    if not n:
        return float("nan")
    return sum(r["by_s"][s][key] * r["by_s"][s]["n"] for r in rows if s in r["by_s"] and r["by_s"][s]["n"]) / n


def _size_comparison(choice: Any) -> dict[str, Any]:
    """The leave-one-size-out comparison of the size methods, per held-out size, for the report."""
    if choice is None or not choice.held:
        return {}
    out = {}
    for name, held in choice.held.items():
        groups = [g for g in held.groups if g.scheme == held.scheme]
        out[name] = {
            "score": choice.scores.get(name),
            "chosen": name == choice.chosen.name,
            "per_size": [{"n_params": g.value, "inside": g.position.inside, "distance": g.position.distance,
                          "n": len(g.members),
                          "rms": {f"{s:g}": r for s, r in zip(held.fractions, g.rms())},
                          "bias": {f"{s:g}": b for s, b in zip(held.fractions, g.bias())}} for g in groups],
        }
    return out


def _calibration_summary(curves: list, results: dict[bool, Any], chosen_mode: bool,
                         held: Optional[dict[bool, dict[str, Any]]] = None,
                         notes: Optional[list[str]] = None,
                         choices: Optional[dict[bool, Any]] = None) -> dict[str, Any]:
    held = held or {}
    choices = choices or {}
    chosen = results[chosen_mode]
    per_curve = pd.DataFrame({
        "run_id": [c.meta["name"] for c in curves],
        "tau": [c.controls.tau for c in curves],
        "tokens_per_param": [c.controls.tokens_per_param for c in curves],
        "fit_mae": list(np.asarray(chosen.curve_mae, dtype=float)),
        "oracle_mae": list(np.asarray(chosen.oracle_curve_mae, dtype=float)),
    })
    per_curve["tpp_band"] = per_curve["tokens_per_param"].round(0)
    by_tpp = per_curve.groupby("tpp_band")[["fit_mae", "oracle_mae"]].mean()
    finite_tau = per_curve[np.isfinite(per_curve["tau"])]
    by_tau = pd.DataFrame(columns=["fit_mae", "oracle_mae"])
    if len(finite_tau):  # a bank of τ = ∞ runs only (no weight decay) has no τ bins
        tau_bins = pd.cut(np.log10(finite_tau["tau"]), bins=min(4, max(1, finite_tau["tau"].nunique())))
        by_tau = finite_tau.groupby(tau_bins, observed=True)[["fit_mae", "oracle_mae"]].mean()
    modes = {}
    for fit_m, result in results.items():
        table = result.predictor.decision_error
        cross = {c.scheme: {f"{s:g}": v for s, v in zip(c.fractions, c.rms())}
                 for c in held.get(fit_m, {}).get("cross", [])}
        groups = (held_out.group_coverage(table, held[fit_m]["cross"])
                  if table is not None and held.get(fit_m, {}).get("cross") else [])
        modes["five-parameter" if fit_m else "paper (m = 0.05)"] = {
            "fit_mae": float(result.fit_mae),
            "oracle_mae": float(result.oracle_mae),
            "params": result.predictor.to_dict().get("params"),
            "size_method": result.predictor.size_method,
            "size_comparison": _size_comparison(choices.get(fit_m)),
            "size_choice_rule": getattr(choices.get(fit_m), "why", None),
            "decision_error": ({f"{s:g}": e for s, e in zip(table.stop_fractions, table.rel_error)}
                               if table is not None else {}),
            "decision_error_source": table.source if table is not None else None,
            "cross_scale_error": ({f"{s:g}": e for s, e in zip(table.stop_fractions, table.cross_scale)}
                                  if table is not None and table.cross_scale is not None else {}),
            "cross_scale_source": table.cross_scale_source if table is not None else None,
            "cross_scale_by_scheme": cross,
            "error_groups": groups,
            "coverage": _coverage(held.get(fit_m, {}), table),
            "fit_notes": list(result.notes),
            "ranking_error": (None if result.predictor.ranking_error is None
                              else result.predictor.ranking_error.to_dict()),
        }
    return {
        "n_curves": len(curves),
        "repeated_data": repeated_data(curves),
        "notes": list(notes or []),
        "chosen_mode": "five-parameter" if chosen_mode else "paper (m = 0.05)",
        "modes": modes,
        "by_tpp": {str(k): v for k, v in by_tpp.to_dict(orient="index").items()},
        "by_tau": {str(k): v for k, v in by_tau.to_dict(orient="index").items()},
        "per_curve": per_curve.drop(columns="tpp_band").to_dict(orient="records"),
    }


def repeated_data(curves: list) -> dict[str, Any]:
    """Which reference runs read their training split more than once (epochs > 1), from each
    curve's ``epochs`` (banked runs; a user's own curves have none: ``known`` counts them)."""
    epochs = {c.meta["name"]: float(c.meta["epochs"]) for c in curves
              if c.meta.get("epochs") is not None and np.isfinite(float(c.meta["epochs"]))}
    repeated = sorted((e, name) for name, e in epochs.items() if e > 1.0)
    return {"known": len(epochs), "max_epochs": max(epochs.values(), default=None),
            "runs": {name: e for e, name in reversed(repeated)}}


def _repeated_markdown(info: dict[str, Any], n_curves: int) -> list[str]:
    if not info or not info.get("known"):
        return ["Repeated data: unknown (no curve records its passes over the training tokens).", ""]
    runs = info["runs"]
    if not runs:
        return [f"Repeated data: none; every reference run read its training split at most once "
                f"(at most {info['max_epochs']:.2f} passes, {info['known']} of {n_curves} curves known).", ""]
    listed = ", ".join(f"{name} ({e:.1f})" for name, e in list(runs.items())[:12])
    more = f" and {len(runs) - 12} more" if len(runs) > 12 else ""
    return [f"Repeated data: **{len(runs)} of {info['known']} reference runs read their training split "
            f"more than once** (up to {info['max_epochs']:.1f} passes; their training loss runs below "
            f"validation): {listed}{more}.", ""]


def _per_s(values: dict[str, Any], digits: int = 1) -> str:
    """'a / b / c' of percentages in stop-fraction order ('n/a' for unmeasured)."""
    return " / ".join(_pct(v, digits) for v in values.values())


def calibration_markdown(summary: dict[str, Any]) -> str:
    """The text of ``calibration.md`` for a :func:`fit_and_report` summary."""
    modes = summary["modes"]
    chosen = modes[summary["chosen_mode"]]
    fractions = list(chosen["decision_error"]) or ["0.1", "0.2", "0.3", "0.5"]
    s_words = " / ".join(fractions)
    lines = [f"# Calibration ({summary['n_curves']} curves)", "",
             f"Chosen: **{summary['chosen_mode']}**, model size in the prediction: **{chosen.get('size_method')}**.", "",
             *_repeated_markdown(summary.get("repeated_data", {}), summary["n_curves"]),
             "Decision-fraction error: RMS relative error of the final loss predicted from the first s",
             "of each curve (leave-one-out: refit without the curve).", "",
             markdown_table(
                 ["mode", "model size", "fit MAE", "oracle MAE", f"decision error, s = {s_words}", "source"],
                 [[mode, info.get("size_method"), f"{100 * info['fit_mae']:.2f}%", f"{100 * info['oracle_mae']:.2f}%",
                   _per_s(info["decision_error"], 2), info.get("decision_error_source")]
                  for mode, info in modes.items()])]
    lines += _size_markdown(modes, s_words)
    lines += ["", "## Cross-scale error", "",
              "Refit without one TPP, model size or τ (pooled RMS per grouping; per held-out group below):", ""]
    for mode, info in modes.items():
        for scheme, errors in info.get("cross_scale_by_scheme", {}).items():
            lines.append(f"- {mode}, {scheme}: s = {s_words}: {_per_s(errors, 2)}")
        if not info.get("cross_scale_by_scheme"):
            lines.append(f"- {mode}: not measured (the bank has one TPP, size and τ, or too few curves)")
    lines += _groups_markdown(chosen, s_words)
    rows = []
    for mode, info in modes.items():
        for scheme, by_label in info.get("coverage", {}).items():
            for label, by_s in by_label.items():
                rows.append([mode, scheme, label, " / ".join(_pct(c.get("1σ")) for c in by_s.values()),
                             " / ".join(_pct(c.get("2σ")) for c in by_s.values())])
    lines += ["", "## Coverage of the stated intervals", "",
              "Fraction of held-out true finals inside predicted ± z·σ, σ = L̂(T)·sqrt(residual² + e(s)²) "
              f"(about 68% / 95% expected for z = 1 / 2), at s = {s_words}. \"cross-scale e(s)\" is what the "
              "predictor states now: for each held-out group, the error of the other groups at its distance.", "",
              markdown_table(["mode", "held out", "stated e(s)", "±1σ covers", "±2σ covers"], rows)]
    lines += _ranking_markdown(summary)
    notes = summary.get("notes", []) + [n for info in modes.values() for n in info.get("fit_notes", [])]
    if notes:
        lines += ["", "## Fit log", ""] + [f"- {n}" for n in dict.fromkeys(notes)]
    for title, key, first in (("By TPP", "by_tpp", "TPP"), ("By log10 τ bin", "by_tau", "log10 τ")):
        if not summary[key]:  # τ bins of a bank whose runs all have τ = ∞
            lines += ["", f"## {title} (chosen mode)", "", "No run with a finite τ (every run has no weight decay)."]
            continue
        lines += ["", f"## {title} (chosen mode)", "",
                  markdown_table([first, "fit MAE", "oracle MAE"],
                                 [[k, f"{100 * row['fit_mae']:.2f}%", f"{100 * row['oracle_mae']:.2f}%"]
                                  for k, row in summary[key].items()])]
    return "\n".join(lines) + "\n"


def _size_markdown(modes: dict[str, Any], s_words: str) -> list[str]:
    """The leave-one-size-out comparison of the size methods (one row per method and size)."""
    rows = []
    for mode, info in modes.items():
        for name, entry in (info.get("size_comparison") or {}).items():
            for g in entry["per_size"]:
                where = f"{'inside' if g['inside'] else 'beyond'}, {g['distance']:.2f}"
                rows.append([mode, name + (" (chosen)" if entry["chosen"] else ""), f"{g['n_params']:.3g}", where,
                             g["n"], _per_s(g["rms"], 2), _per_s(g["bias"], 2)])
            rows.append([mode, name, "score", "", "", f"{100 * entry['score']:.2f}%", ""])
    if not rows:
        return []
    whys = [f"- {mode}: {info['size_choice_rule']}" for mode, info in modes.items() if info.get("size_choice_rule")]
    return ["", "## Model size in the prediction", "",
            "Each model size predicted by a refit without it (leave-one-size-out), per way of bringing N into "
            "the prediction (simplest first); the score is the mean over sizes and s ≤ 0.3 of each size's RMS. "
            "The rule: the simplest method unless a more complex one beats it by more than "
            f"{held_out.CHOICE_NOISE_Z:g} standard errors of their paired per-size difference. "
            "Where: inside or beyond the remaining sizes, and |log| distance to the nearest.", "",
            markdown_table(["mode", "method", "held-out N", "where", "curves", f"RMS, s = {s_words}",
                            f"bias, s = {s_words}"], rows), "", "Chosen:", "", *whys]


def _groups_markdown(info: dict[str, Any], s_words: str) -> list[str]:
    """Per held-out group of the chosen mode: its error, the e(s) the other groups state for it
    and whether ±2σ covered its truths."""
    groups = info.get("error_groups") or []
    if not groups:
        return []
    # Every size group in full (what issue 15 asks to see: the end sizes, not a pooled figure);
    # on the other axes the leave-one-out groups in full and the extrapolations summarised.
    shown = [g for g in groups if g["axis"] == "n_params" or "extrapolation" not in g["scheme"]]
    rows = [[g["scheme"], f"{g['value']:.4g}", f"{'inside' if g['inside'] else 'beyond'}, {g['distance']:.2f}",
             g["n"], _per_s({k: v["rms"] for k, v in g["by_s"].items()}, 1),
             _per_s({k: v["stated"] for k, v in g["by_s"].items()}, 1),
             " / ".join(_pct(v["2σ"]) for v in g["by_s"].values())] for g in shown]
    lines = ["", "## Error off the calibrated scale, per held-out group (chosen mode)", "",
             "Leave-one-group-out and extrapolation (calibrated on the values below (upward) or above "
             "(downward) one, every value beyond predicted). \"stated\" is the e(s) the error model of the "
             "*other* groups gives this group (an out-of-sample check of the distance model).", "",
             markdown_table(["held out", "value", "where (log distance)", "curves", f"RMS, s = {s_words}",
                             f"stated e(s), s = {s_words}", "±2σ covers"], rows)]
    rest = [g for g in groups if g not in shown]
    for scheme in dict.fromkeys(g["scheme"] for g in rest):
        mine = [g for g in rest if g["scheme"] == scheme]
        cover = " / ".join(_pct(_pooled(mine, k, "2σ")) for k in mine[0]["by_s"])
        worst = " / ".join(_pct(max(g["by_s"][k]["rms"] for g in mine), 1) for k in mine[0]["by_s"])
        lines.append(f"\n- {scheme}: {len(mine)} groups at log distances "
                     f"{min(g['distance'] for g in mine):.2f}–{max(g['distance'] for g in mine):.2f}; largest RMS "
                     f"{worst}; ±2σ covers {cover} (pooled; all groups in calibration.json)")
    return lines


def _ranking_markdown(summary: dict[str, Any]) -> list[str]:
    """The ranking-error section of calibration.md (predictors.ranking)."""
    from hpo.tables import markdown_table
    from predictors.ranking import SWEEP_KINDS

    lines: list[str] = []
    for mode, info in summary["modes"].items():
        table = info.get("ranking_error")
        if not table:
            continue
        lines += ["", f"## Ranking error ({mode})", "",
                  "How reliably the predictor orders the trials of one sweep: for pairs of one sweep, the RMS of "
                  "log(P_i/P_j) − log(F_i/F_j), and the ranking scale σ of P(order right) = Φ(|log(P_i/P_j)|/σ) "
                  "at its upper bound (what the scheduler's margin uses; 100% = no evidence of any order). "
                  f"In-scale: {table['source']}; across scales: {table.get('cross_scale_source') or 'not measured'}.", ""]
        rows = []
        for which, kinds in (("in-scale", table["kinds"]), ("across scales", table.get("cross_scale") or {})):
            for kind, row in kinds.items():
                for k, s_ in enumerate(row["stop_fractions"]):
                    rows.append([SWEEP_KINDS.get(kind, kind), which, f"{s_:g}", row["n_groups"][k], row["n_pairs"][k],
                                 f"{100 * row['rms'][k]:.2f}%", f"{100 * row['scale'][k]:.2f}%", *_order_cells(row, k)])
        lines.append(markdown_table(["kind of sweep", "held out", "s", "sweeps", "pairs", "RMS log-ratio error",
                                     "ranking scale σ", "pairs right: predicted / losses", "order used (w)",
                                     "σ of that order"], rows))
        groups = table.get("cross_groups") or []
        if groups:
            lines += ["", "Held-out groups (sweeps the fit never saw, at another TPP or model size: what a sweep "
                      "as far off the calibrated scale gets; 100% = no evidence, then the losses' order applies):", ""]
            grows = []
            for g in groups:
                for kind, row in g["kinds"].items():
                    for k, s_ in enumerate(row["stop_fractions"]):
                        grows.append([f"{g['axis']} {g['value']:g}", f"{'inside' if g['inside'] else 'beyond'}, "
                                      f"{g['distance']:.2f}", SWEEP_KINDS.get(kind, kind), f"{s_:g}", row["n_pairs"][k],
                                      *_order_cells(row, k)])
            lines.append(markdown_table(["held out", "where (log distance)", "kind of sweep", "s", "pairs",
                                         "pairs right: predicted / losses", "order used (w)", "σ of that order"], grows))
        if table.get("seed_noise") is not None:
            lines += ["", f"Seed noise of a final loss (the keep rule's default tolerance): "
                      f"{100 * table['seed_noise']:.2f}%, {table.get('seed_noise_source')}."]
        missing = [SWEEP_KINDS[k] for k in SWEEP_KINDS if k not in table["kinds"]]
        if missing:
            lines += ["", "Not in the bank (the largest measured scale applies to them): " + "; ".join(missing) + "."]
    return lines


def _order_cells(row: dict[str, Any], k: int) -> list[str]:
    """The order columns of a ranking-error row (blank in files without them)."""
    if row.get("weight") is None:
        return ["", "", ""]
    return [f"{100 * row['agreement'][k]:.0f}% / {100 * row['loss_agreement'][k]:.0f}%", f"{row['weight'][k]:g}",
            f"{100 * row['order_scale'][k]:.2f}%"]


def _pct(value: Any, digits: int = 0) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{100 * value:.{digits}f}%"


#: Widest calibration plot (pixels): panels wrap into rows beyond ``PLOT_COLUMNS``.
PLOT_MAX_WIDTH_PX = 2000
PLOT_COLUMNS = 3
PLOT_DPI = 100


def _render_normalized(curves: list, predictor: Any) -> bytes:
    """Every curve's ℓ = L/L(1) (solid) and the predictor's ℓ (dashed; reference curves or the
    surrogate at the run's controls and size), one panel per TPP (and per model size when the
    bank has several), at most ``PLOT_COLUMNS`` panels a row (≤ ``PLOT_MAX_WIDTH_PX`` wide), each
    y-axis fitted to its curves over t̂ ≥ 0.05. Colour: τ within a panel. Returns the PNG's bytes
    (written by the caller once every output of the calibration is ready)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from predictors.curves import controls_with_size, curve_size

    sizes = sorted({round(float(n), -2) for n in (curve_size(c) for c in curves) if n is not None})

    def key(c: Any) -> tuple[float, float]:
        n = curve_size(c)
        return (round(c.controls.tokens_per_param, 3), round(float(n), -2) if n is not None and len(sizes) > 1 else 0.0)

    panels = sorted({key(c) for c in curves})
    columns = min(PLOT_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    width_in = min(PLOT_MAX_WIDTH_PX / PLOT_DPI, 6.0 * columns)
    fig = Figure(figsize=(width_in, 3.6 * rows), dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    cmap = colormaps["viridis"]
    finite_taus = sorted({c.controls.tau for c in curves if math.isfinite(c.controls.tau)})
    for index, panel in enumerate(panels):
        ax = fig.add_subplot(rows, columns, index + 1)
        values: list[np.ndarray] = []
        for curve in (c for c in curves if key(c) == panel):
            tau = curve.controls.tau
            colour = (cmap(finite_taus.index(tau) / max(1, len(finite_taus) - 1)) if tau in finite_taus
                      else "tab:red")
            mask = curve.t_hat >= 0.05
            t = curve.t_hat[mask]
            ax.plot(t, curve.normalized[mask], color=colour, lw=1, alpha=0.8)
            controls = controls_with_size(curve)
            predicted = equations.normalized_loss(predictor.loss_curve(t, controls, curve.final_loss), curve.final_loss)
            ax.plot(t, predicted, color=colour, lw=1, ls="--")
            values += [curve.normalized[mask], predicted]
        data = np.concatenate(values) if values else np.array([1.0])
        lo, hi = float(np.quantile(data, 0.005)), float(np.quantile(data, 0.995))
        pad = 0.05 * max(hi - lo, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)
        title = f"TPP {panel[0]:g}" + (f", N = {panel[1]:.3g}" if panel[1] else "")
        ax.set_title(f"{title} (solid: runs, dashed: predictor)", fontsize=9)
        ax.set_xlabel("training fraction t̂")
        ax.set_ylabel("L(t̂)/L(1)")
        ax.grid(alpha=0.3)
    if finite_taus:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        mappable = ScalarMappable(norm=Normalize(0, max(1, len(finite_taus) - 1)), cmap=cmap)
        bar = fig.colorbar(mappable, ax=fig.axes, shrink=0.8, ticks=range(len(finite_taus)))
        bar.ax.set_yticklabels([f"{t:g}" for t in finite_taus])
        bar.set_label("τ")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def calibrate(config_path: str, overrides: tuple[str, ...] = (), fit_only: bool = False) -> dict[str, Any]:
    """``hpo calibrate CONFIG``: bank the runs (unless ``fit_only``), fit, report; under the
    output folder's lock (``hpo.output_lock``): two calibrations into one folder would break
    its ``mlflow.db``."""
    config = load_calibration_config(config_path, overrides)
    with hold_folder(_output(config), "hpo calibrate"):
        return _calibrate(config, fit_only)


def _calibrate(config: CalibrationConfig, fit_only: bool) -> dict[str, Any]:
    bank_path = _resolve(config.bank)
    if not fit_only:
        from hpo.banking import run_reference_curves  # Ray and torch: only when runs are trained

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
    on curves from ``hpo.curve_import`` (a user's file or MLflow experiment)."""
    if config.predictor_out is None:
        raise ConfigError("predictor_out: a calibration from curves must write a predictor (got null)")
    predictor_path = _predictor_out(config)
    with hold_folder(_output(config), "hpo calibrate"):
        summary = fit_and_report(list(imported.curves), config.fit, predictor_path, _output(config),
                                 provenance={"calibration": config.name, "curves": imported.source},
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
    """``hpo.calibrate.CalibrationTrainable`` resolves lazily to ``hpo.banking``'s, so Ray
    experiments pickled before the trainable moved there still restore, without this module
    importing Ray."""
    if name in ("CalibrationTrainable", "CurveCollector", "run_reference_curves"):
        from hpo import banking

        return getattr(banking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
