"""The replay half of ``benchmarks/decisions.py``: every method's settings run on held-out banks.

What lives here: the complete replicates of a bank (:func:`replicates`), how well the predictor
orders the trials (:func:`ranking_diagnostics`), and one whole bank replayed
(:func:`replay_bank` → :class:`Bank`). The replay itself (every method's settings, one setting
replayed and scored, the rows summed up per setting, a method's frontier) is the package's one
engine, ``hpo.trials.rule_replay``, which ``hpo replay`` and ``benchmarks/public_sweeps.py`` use too.

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
from typing import Any, Optional, Sequence

import numpy as np

from predictors.prediction import predict_at_rung
from hpo.calibration.calibrate import load_calibration_config
from hpo.trials.curve_bank import load_bank
from hpo.common.overrides import ConfigError
from hpo.trials.replay import run_points, seed_noise, true_finals
from hpo.trials.rule_replay import Point, Row, aggregate, score, settings
from predictors import Predictor
from predictors.kinds import SWEEP_KINDS
from predictors.run_keys import METRIC_COLUMNS

REPO_ROOT = Path(__file__).resolve().parents[1]


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
