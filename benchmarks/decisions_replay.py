"""The replay half of ``benchmarks/decisions.py``: every method's settings run on held-out banks.

What lives here: the settings each early-stopping method is tried with (:func:`settings`), the
complete replicates of a bank (:func:`replicates`), one setting replayed and scored on one
replicate (:func:`score` → :class:`Row`), the rows summed up per setting (:func:`aggregate` →
:class:`Point`) and a method's frontier at a compute budget (:func:`frontier`), how well the
predictor orders the trials (:func:`ranking_diagnostics`), and one whole bank replayed
(:func:`replay_bank` → :class:`Bank`).

Why apart: this is the measurement; ``benchmarks/decisions.py`` keeps what is judged and written
from it (the issue's targets, ``select_z``, the markdown report, the plots) and the command
line. Every definition (compute, pick, regret, seed noise, frontier) is stated in the docstring
of ``benchmarks/decisions.py``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from predictors.curves import compute_fraction, is_finished
from predictors.prediction import predict_at_rung
from hpo.calibration.calibrate import load_calibration_config
from hpo.trials.curve_bank import load_bank
from hpo.common.overrides import ConfigError
from hpo.trials.replay import run_points, seed_noise, true_finals
from predictors import Predictor
from predictors.kinds import SWEEP_KINDS
from predictors.run_keys import METRIC_COLUMNS

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setting:
    """One method with one choice of its knobs."""

    method: str
    label: str
    make: Callable[[], Any]  # a fresh scheduler
    default: bool = False


@dataclass
class Row:
    """One setting on one replicate."""

    family: str
    seed: int
    method: str
    setting: str
    default: bool
    compute: float
    regret: Optional[float]
    pick: Optional[str]
    best: str
    within_noise: Optional[bool]
    picked_best: bool
    best_kept: Optional[bool] = None  # the true best trained to the end (survived every rung)
    note: str = ""
    bank: str = ""
    n_trials: int = 0


def _rung_label(rungs: Sequence[float]) -> str:
    return "/".join(f"{r:g}" for r in rungs)


def settings(predictor: Predictor, quick: bool = False) -> list[Setting]:
    """Every method's settings, each a fresh scheduler per replicate. The keep rules
    (``hpo.decisions.keep``: collapse, ASHA, current-best, top-k, the paired test) all run in
    ``CollapseScheduler`` (sync), so one harness replays them the same way; median stopping is
    Ray's own ``MedianStoppingRule`` (it is not a rung rule)."""
    from ray.tune.schedulers import MedianStoppingRule

    from hpo.decisions.keep import AshaRule, CollapseRule, CurrentBestRule, PairedTestRule, TopKRule
    from hpo.decisions.scheduler import CollapseScheduler
    from hpo.trials.sweep_config import SchedulerSettings

    default = SchedulerSettings()

    def scheduler(rule: Any, rungs: Sequence[float], rf: float = 2.0) -> Callable[[], Any]:
        return lambda: CollapseScheduler(predictor=predictor, settings=SchedulerSettings(
            rungs=list(rungs), reduction_factor=rf, margin="calibrated", mode="sync"), rule=rule)

    out: list[Setting] = []
    rung_sets = [(0.1,), (0.2,), (0.3,), (0.05, 0.1, 0.2), (0.1, 0.2), (0.1, 0.2, 0.3), (0.1, 0.3, 0.5),
                 (0.2, 0.3, 0.5)]
    zs, rfs, reads = (0.0, 0.25, 0.5, 1.0, 2.0), (2.0,), (True, False)
    if quick:
        rung_sets, zs, rfs = [tuple(default.rungs)], (0.0, default.rule['margin_z']), (default.reduction_factor,)
    for rungs in rung_sets:
        for z in zs:
            for rf in rfs:
                for read in reads:
                    if (len(rungs) == 1 and rf != rfs[0]) or (z == 0 and not read):
                        continue  # rf only matters with an intermediate rung; z 0 reads nothing
                    is_default = (list(rungs) == list(default.rungs) and z == default.rule['margin_z'] and read
                                  and rf == default.reduction_factor and default.margin == "calibrated")
                    out.append(Setting("collapse", f"rungs {_rung_label(rungs)}, z {z:g}, rf {rf:g}"
                                       + ("" if read else ", calibrated σ only"),
                                       scheduler(CollapseRule(z, read_sweep=read), rungs, rf), default=is_default))
    for grace in ((0.1,) if quick else (0.05, 0.1, 0.2, 0.3)):
        for rf in ((2,) if quick else (2, 3, 4)):
            rungs = [grace * rf ** k for k in range(8) if grace * rf ** k < 0.99]
            out.append(Setting("asha", f"rungs {_rung_label(rungs)} (grace {grace:g}, rf {rf})",
                               scheduler(AshaRule(), rungs, rf)))
    for grace in ((0.1,) if quick else (0.1, 0.2, 0.3)):
        out.append(Setting("median", f"grace {grace:g}", lambda g=grace: MedianStoppingRule(
            metric="loss", mode="min", time_attr="train_fraction", grace_period=g, min_samples_required=3)))
    for s in ((0.1, 0.2) if quick else (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)):
        out.append(Setting("current-best", f"s {s:g}", scheduler(CurrentBestRule(), (s,))))
    for rungs in ([tuple(default.rungs)] if quick else [(0.1,), (0.2,), (0.3,), (0.1, 0.3)]):
        for k in ((1, 2) if quick else (1, 2, 3)):
            out.append(Setting("top-k", f"rungs {_rung_label(rungs)}, k {k}", scheduler(TopKRule(k), rungs)))
    for rungs in ([(0.1, 0.2)] if quick else [(0.1,), (0.2,), (0.1, 0.2), (0.1, 0.2, 0.3), (0.2, 0.3, 0.5)]):
        for z in (2.0,):
            out.append(Setting("paired-test", f"rungs {_rung_label(rungs)}, z {z:g}",
                               scheduler(PairedTestRule(z), rungs)))
    return out


def replicates(config_path: str, metric: str = "loss") -> tuple[Any, dict[tuple[str, int], list[str]], list[str]]:
    """The bank, each complete (family, seed) replicate's run ids (complete: every run has a
    final of ``metric``), and what is missing."""
    config = load_calibration_config(config_path)
    bank = Path(config.bank) if Path(config.bank).is_absolute() else REPO_ROOT / config.bank
    if not bank.exists():
        raise ConfigError(f"{bank}: no such curve bank (named by {config_path}); train it with "
                          f"`hpo calibrate {config_path}`")
    frame = load_bank(bank)
    finals = true_finals(frame, METRIC_COLUMNS[metric])
    groups: dict[tuple[str, int], list[str]] = {}
    for run in config.sweep_runs():
        groups.setdefault((run.sweep, run.seed), []).append(run.run_id)
    complete, missing = {}, []
    for key, ids in groups.items():
        absent = [r for r in ids if r not in finals]
        if absent:
            missing.append(f"{key[0]} seed {key[1]}: {len(absent)} of {len(ids)} runs not banked or not complete")
        else:
            complete[key] = sorted(ids)
    return frame, complete, missing


def score(family: str, seed: int, setting: Setting, frame: Any, runs: Sequence[str],
          points: dict[str, list[dict[str, Any]]], finals: dict[str, float], sigma: Optional[float]) -> Row:
    """One setting replayed on one replicate, scored: compute, pick, regret, within σ_seed, and
    whether the true best trained to the end (kept at every rung: the same test for every method)."""
    from hpo.trials.simulator import SimulatedSweep

    best = min(runs, key=lambda r: (finals[r], r))
    sim = SimulatedSweep(setting.make(), {r: points[r] for r in runs}, n_workers=2)
    try:
        reached = sim.run().reached
    except Exception as exc:  # noqa: BLE001 - a scheduler that cannot run here is reported, not fatal
        return Row(family, seed, setting.method, setting.label, setting.default, math.nan, None, None, best,
                   None, False, note=f"{type(exc).__name__}: {exc}")
    done = [r for r in runs if is_finished(reached.get(r, 0.0))]
    pick = min(done, key=lambda r: (finals[r], r)) if done else None
    regret = None if pick is None else finals[pick] - finals[best]
    return Row(family, seed, setting.method, setting.label, setting.default, compute_fraction(reached),
               regret, pick, best, None if regret is None or sigma is None else regret <= sigma + 1e-12,
               pick == best, best in done)


@dataclass
class Point:
    """A setting on one family, over its replicates."""

    method: str
    setting: str
    default: bool
    compute: float
    regret: float
    regret_sd: float
    within: int
    n: int
    best_kept: Optional[int] = None


def aggregate(rows: Sequence[Row]) -> dict[str, list[Point]]:
    """family → one Point per setting (settings with a failed replicate are left out)."""
    out: dict[str, list[Point]] = {}
    keys = dict.fromkeys((r.family, r.method, r.setting) for r in rows)
    for family, method, label in keys:
        mine = [r for r in rows if (r.family, r.method, r.setting) == (family, method, label)]
        if any(r.regret is None or not math.isfinite(r.compute) for r in mine):
            continue
        regrets = np.array([r.regret for r in mine], dtype=float)
        kept = [r.best_kept for r in mine if r.best_kept is not None]
        out.setdefault(family, []).append(Point(
            method, label, mine[0].default, float(np.mean([r.compute for r in mine])), float(regrets.mean()),
            float(regrets.std(ddof=1)) if len(mine) > 1 else 0.0, sum(bool(r.within_noise) for r in mine), len(mine),
            sum(kept) if kept else None))
    return out


def frontier(points: Sequence[Point], method: str, budget: float) -> Optional[Point]:
    """The lowest mean regret among ``method``'s settings with mean compute ≤ ``budget``
    (ties: less compute)."""
    mine = [p for p in points if p.method == method and p.compute <= budget + 1e-9]
    return min(mine, key=lambda p: (p.regret, p.compute)) if mine else None


def ranking_diagnostics(predictor: Predictor, complete: dict[tuple[str, int], list[str]],
                        points: dict[str, list[dict[str, Any]]], finals: dict[str, float],
                        fractions: Sequence[float] = (0.1, 0.2, 0.3, 0.5)) -> list[list[Any]]:
    """Per kind of sweep and s, over the pairs of each replicate: how often the order of the
    predicted finals (``predictors.prediction.predict_at_rungs``) and of the losses at the rung agree with
    the order of the true finals, and the RMS of their log-ratio errors."""
    import itertools

    rows = []
    for family in dict.fromkeys(k[0] for k in complete):
        for s in fractions:
            agree = {"pred": [], "loss": []}
            err = {"pred": [], "loss": []}
            for (fam, _), runs in complete.items():
                if fam != family:
                    continue
                seen = {}
                for r in runs:
                    t = [p["train_fraction"] for p in points[r]]
                    y = [p["loss"] for p in points[r]]
                    pred = predict_at_rung(predictor, t, y, points[r][0], s)
                    seen[r] = (pred.final_loss, pred.loss)
                for a, b in itertools.combinations(runs, 2):
                    true = math.log(finals[a] / finals[b])
                    for key, k in (("pred", 0), ("loss", 1)):
                        if seen[a][k] is None or seen[b][k] is None:
                            continue
                        d = math.log(seen[a][k] / seen[b][k])
                        agree[key].append(np.sign(d) == np.sign(true))
                        err[key].append(d - true)
            if agree["pred"]:
                rows.append([SWEEP_KINDS.get(family, family), f"{s:g}", len(agree["pred"]),
                             f"{100 * np.mean(agree['pred']):.0f}%", f"{100 * np.mean(agree['loss']):.0f}%",
                             f"{100 * np.sqrt(np.mean(np.square(err['pred']))):.2f}%",
                             f"{100 * np.sqrt(np.mean(np.square(err['loss']))):.2f}%"])
    return rows


def corpus_name(trainer: dict[str, Any]) -> str:
    """A bank's corpus in a word: ``stdlib``, else the last part of its directory."""
    corpus = str((trainer.get("data") or {}).get("corpus", "stdlib"))
    return corpus if corpus == "stdlib" else Path(corpus).name or corpus


def bank_corpus(config_path: str) -> str:
    return corpus_name(load_calibration_config(config_path).trainer)


def with_order_error_from(predictor: Predictor, config_paths: Sequence[str], metric: str = "loss") -> Predictor:
    """``predictor`` with the order error the keep rule reads measured on these banks' sweeps
    (``hpo.calibration.ranking_error.corpus_order_error``: banks of corpora other than the fit's
    and the held-out one); kinds they do not sweep keep the predictor's own."""
    import dataclasses

    from hpo.calibration.ranking_error import corpus_order_error
    from hpo.calibration.fit import complete_curves
    from hpo.trials.curve_bank import bank_curves

    curves = []
    for c in config_paths:
        frame, complete, _ = replicates(c, metric)
        ids = {r for v in complete.values() for r in v}
        curves += bank_curves(frame[frame["run_id"].isin(ids)], loss_column=METRIC_COLUMNS[metric])
    across = corpus_order_error(predictor, complete_curves(curves)[0], sorted({bank_corpus(c) for c in config_paths}))
    if across is None or predictor.ranking_error is None:
        return predictor
    table = predictor.ranking_error
    return dataclasses.replace(predictor, ranking_error=dataclasses.replace(
        table, kinds={**table.kinds, **across.kinds}, source=across.source))


@dataclass
class Bank:
    """One held-out bank replayed: its rows, aggregates, seed noise and what was missing."""

    config: str
    rows: list[Row]
    agg: dict[str, list[Point]]
    sigmas: dict[str, Optional[float]]
    missing: list[str]
    meta: dict[str, Any]


def replay_bank(config_path: str, predictor: Predictor, *, quick: bool, families: Sequence[str],
                started: float, metric: str = "loss") -> Bank:
    """Every setting of every method on every complete replicate of one bank, deciding on and
    scored by ``metric`` (``predictors.run_keys.METRIC_COLUMNS``: the smoothed training loss or
    the validation loss, for its curves and its true finals alike)."""
    from predictors.smoothing import FINAL_LOSS_DEFINITION

    column = METRIC_COLUMNS[metric]
    frame, complete, missing = replicates(config_path, metric)
    if families:
        complete = {k: v for k, v in complete.items() if k[0] in families}
    if not complete:
        raise ConfigError(f"no complete replicate in the bank of {config_path}")
    finals = true_finals(frame, column)
    points = {r: run_points(frame, r, column) for ids in complete.values() for r in ids}
    kinds = list(dict.fromkeys(k[0] for k in complete))
    sigmas = {f: seed_noise(frame, [r for k, ids in complete.items() if k[0] == f for r in ids], finals=finals).std
              for f in kinds}
    # A bank of one seed cannot measure its seed noise: the predictor's (relative, from the
    # calibration's repeated seeds) times the kind's mean final stands in, and says so.
    stand_in = [f for f in kinds if sigmas[f] is None and predictor.seed_noise is not None]
    for f in stand_in:
        mean_final = float(np.mean([finals[r] for k, ids in complete.items() if k[0] == f for r in ids]))
        sigmas[f] = predictor.seed_noise * mean_final
    rows: list[Row] = []
    all_settings = settings(predictor, quick=quick)
    for i, (key, runs) in enumerate(sorted(complete.items())):
        for setting in all_settings:
            row = score(key[0], key[1], setting, frame, runs, points, finals, sigmas[key[0]])
            row.bank = config_path
            rows.append(row)
        print(f"  {Path(config_path).stem}: {key[0]} seed {key[1]}: {len(all_settings)} settings "
              f"[{i + 1}/{len(complete)}, {time.monotonic() - started:.0f} s]", flush=True)
    config = load_calibration_config(config_path)
    n_params = sorted({int(v) for v in frame.loc[frame["run_id"].isin(points), "n_params"].dropna()}) \
        if "n_params" in frame else []
    meta = {"bank": config.bank, "corpus": corpus_name(config.trainer), "n_replicates": len(complete), "n_runs": len(points),
            "n_trials": max(len(v) for v in complete.values()), "kinds": kinds,
            "seeds": sorted({k[1] for k in complete}), "n_params": n_params, "sigma_stand_in": stand_in,
            "tpp": config.trainer.get("tokens_per_param"), "final_loss": FINAL_LOSS_DEFINITION, "metric": metric,
            "diagnostics": ranking_diagnostics(predictor, complete, points, finals)}
    return Bank(config_path, rows, aggregate(rows), sigmas, missing, meta)
