"""``hpo replay``: what every keep rule would have done on sweeps that already ran.

The runs come from a curve file (CSV/parquet, the ``--from-curves`` format), an MLflow
experiment (``--from-mlflow ID``), a folder of training logs (W&B run exports, ``--from-logs``)
or ``public``: the packaged public 124M-parameter sweeps (``hpo/data/curves``, no download).
They are grouped into sweeps (runs of one seed that differ only in η, B or λ, or in the column
``--swept`` names: ``hpo.trials.replay.curve_sweeps``); runs that form no sweep are listed. Each
sweep is replayed through every setting of every rule (``hpo.trials.rule_replay``, the engine
``benchmarks/decisions.py`` and ``benchmarks/public_sweeps.py`` use) and, with every trial
stopped at s = 0.1/0.2/0.3, predicted-best against current-best is scored.

Printed: one table, a few rows per sweep (the default, one setting of each other rule, the
default's early answer, predicted-best and current-best at each s: compute, pick, regret
against the sweep's best final, within noise), then the totals. Written: ``replay.json``
(every setting on every sweep) and ``replay.png`` (regret against compute, a point per setting).

The noise yardstick: the re-runs' spread where the runs hold re-runs (the public logs), else
the seed-to-seed spread of configurations run with several seeds, else the predictor's relative
seed noise times the mean final; the table says which.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from hpo.common.overrides import ConfigError

#: The stop fractions printed per sweep (replay.json holds FRACTIONS, s = 0.5 too).
SHOWN_S = (0.1, 0.2, 0.3)
#: One setting per rule shown in the table besides the default (replay.json and the plot hold all).
SHOWN = {"asha": "rungs 0.1/0.2/0.4/0.8 (grace 0.1, rf 2)", "median": "grace 0.1", "top-k": "rungs 0.3, k 1",
         "paired-test": "rungs 0.1/0.2, z 2"}
SWEPT_WORDS = {"eta": "η", "batch_size": "B", "weight_decay": "λ"}


@dataclass
class Runs:
    """Finished runs from one source, grouped into sweeps."""

    label: str  # the source in words
    sweeps: dict[str, list[Any]]  # sweep name → its curves
    alone: list[str]  # runs that form no sweep, and why
    notes: list[str]  # runs left out by the import, and why
    noise: Optional[float]
    noise_words: str
    swept: tuple[str, ...]
    metric: str
    extra: dict[str, Any] = field(default_factory=dict)


def _seed_spread(curves: Sequence[Any]) -> tuple[Optional[float], int]:
    """The pooled std (ddof 1) of the final loss over configurations run with several seeds:
    runs that agree on everything but the seed (``curve_sweeps`` with nothing swept)."""
    from hpo.trials.replay import curve_sweeps

    groups, _ = curve_sweeps(curves, swept=())
    variances = [float(np.var([c.final_loss for c in members], ddof=1)) for members in groups.values()
                 if len({c.meta.get("seed") for c in members}) == len(members)
                 and len({c.controls.tau for c in members}) == 1]
    return (float(math.sqrt(np.mean(variances))), len(variances)) if variances else (None, 0)


def _group(curves: Sequence[Any], swept: tuple[str, ...]) -> tuple[dict[str, list[Any]], list[str]]:
    """Sweeps of one seed each (a sweep repeated with another seed is another sweep)."""
    from hpo.trials.replay import curve_sweeps

    seeds = sorted({str(c.meta.get("seed", "")) for c in curves})
    sweeps: dict[str, list[Any]] = {}
    alone: list[str] = []
    for seed in seeds:
        mine = [c for c in curves if str(c.meta.get("seed", "")) == seed]
        found, lonely = curve_sweeps(mine, swept=swept)
        suffix = f" seed {seed}" if len(seeds) > 1 else ""
        sweeps.update({name + suffix: members for name, members in found.items()})
        alone += lonely
    return dict(sorted(sweeps.items())), alone


def load_runs(args: argparse.Namespace) -> Runs:
    """The runs ``args`` names, grouped, with their noise yardstick (raises ``InputError``s)."""
    from hpo.calibration.curve_import import load_curves_file, load_mlflow_curves
    from hpo.calibration.log_import import load_curve_bench, load_log_dir, rerun_spread, split
    from hpo.data import public_curves_path

    given = [x for x in (args.source, args.from_mlflow) if x]
    if len(given) != 1:
        raise ConfigError("replay: give one source: a curve file, a folder of training logs, `public`, "
                          "or --from-mlflow EXPERIMENT_ID")
    swept = (args.swept,) if args.swept else ("eta", "batch_size", "weight_decay")
    logs = None
    extra: dict[str, Any] = {}
    if args.from_mlflow:
        imported = load_mlflow_curves(args.from_mlflow, tracking_uri=args.tracking_uri, metric=args.metric)
        curves, notes, label, metric = imported.curves, imported.notes, imported.source, args.metric
    elif args.source == "public":
        logs = load_curve_bench(public_curves_path())
        calibration, curves, corpus = split(logs)
        notes, metric = [], "val_loss"
        label = (f"the packaged public sweeps (hpo/data/curves): {corpus}, N > 7e7 (124M parameters); the "
                 f"{len(calibration)} smaller runs calibrated the predictor and are not replayed")
        extra = {"calibration_runs": len(calibration)}
    elif Path(args.source).is_dir():
        logs = load_log_dir(args.source, metric=args.metric if args.metric != "loss" else "val_loss")
        reruns = set(logs.reruns)
        curves = [c for c in logs.curves if c.meta["name"] not in reruns]
        notes, label, metric = logs.notes, f"logs:{Path(args.source).resolve()}", "val_loss"
    else:
        imported = load_curves_file(args.source)
        curves, notes, label, metric = imported.curves, imported.notes, imported.source, "loss"
    if not curves:
        raise ConfigError(f"replay: {label}: no finished run to replay" + (f" ({'; '.join(notes)})" if notes else ""))
    if args.swept and not any(c.meta.get(args.swept) is not None for c in curves):
        raise ConfigError(f"--swept: no run of {label} has a column {args.swept!r}")
    sweeps, alone = _group(curves, swept)
    spread = rerun_spread(logs) if logs is not None else None
    if spread is not None:
        noise, words = spread["rms_difference"], (f"RMS of the final-loss differences of {len(spread['pairs'])} "
                                                  "re-run pairs with identical settings")
    else:
        noise, n = _seed_spread(curves)
        words = f"seed-to-seed std of the final over {n} configuration(s) run with several seeds" if n else ""
    return Runs(label, sweeps, alone, notes, noise, words, swept, metric, extra)


def _predictor(args: argparse.Namespace, runs: Runs) -> tuple[Any, str]:
    from hpo.data import default_predictor_path
    from predictors import Predictor

    if args.predictor:
        return Predictor.load(args.predictor), args.predictor
    sizes = [c.controls.n_params for members in runs.sweeps.values() for c in members if c.controls.n_params]
    path = default_predictor_path(float(np.median(sizes)) if sizes else None)
    return Predictor.load(path), f"packaged {path.name}"


def _arm_label(curve: Any, members: Sequence[Any], swept: Sequence[str]) -> str:
    """A run named by the swept values that tell it from the rest of its sweep (its name otherwise)."""
    parts = []
    for key in swept:
        values = {m.meta.get(key) for m in members}
        if len(values) > 1 and curve.meta.get(key) is not None:
            parts.append(f"{SWEPT_WORDS.get(key, key)}={curve.meta[key]:.3g}" if isinstance(curve.meta[key], float)
                         else f"{SWEPT_WORDS.get(key, key)}={curve.meta[key]}")
    return ", ".join(parts) or str(curve.meta["name"])


def _fmt(value: Optional[float], spec: str = ".4f") -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """Run the replay ``args`` asks for; print the table, write replay.json and replay.png."""
    from hpo.common.paths import check_output_dir
    from hpo.reporting.plots import plot_replay
    from hpo.trials import rule_replay
    from predictors.io import atomic_write_json, json_safe

    started = time.monotonic()
    out = check_output_dir(args.output or f"runs/replay/{'public' if args.source == 'public' else 'sweeps'}",
                           "--output")
    runs = load_runs(args)
    if not runs.sweeps:
        raise ConfigError(f"replay: {runs.label}: no two runs differ only in {'/'.join(runs.swept)}: no sweep to "
                          "replay; " + "; ".join(runs.alone[:5]) + (" …" if len(runs.alone) > 5 else ""))
    predictor, predictor_words = _predictor(args, runs)
    noise, noise_words = runs.noise, runs.noise_words
    if noise is None and predictor.seed_noise is not None:
        finals = [c.final_loss for members in runs.sweeps.values() for c in members]
        noise = float(predictor.seed_noise * np.mean(finals))
        noise_words = (f"no re-runs or repeated seeds here: the predictor's relative seed noise "
                       f"({100 * predictor.seed_noise:.2f}%) times the mean final")
    every = rule_replay.settings(predictor, quick=args.quick)
    rows = rule_replay.replay_sweeps(predictor, runs.sweeps, noise, every=every)
    stop_rows = rule_replay.stop_at_s(predictor, runs.sweeps, noise)
    default = next(s for s in every if s.default)
    answers = {}
    for name, members in runs.sweeps.items():
        points, finals = rule_replay.sweep_points(members)
        _, scheduler = rule_replay.simulate(default, points)
        answer = getattr(getattr(scheduler, "state", None), "early_answer", None)
        if answer:
            best = min(finals.values())
            answers[name] = {"pick": answer["trial_id"], "rung": answer["rung"],
                             "compute": answer["compute_fraction"], "regret": finals[answer["trial_id"]] - best}
    table = _table(runs, rows, stop_rows, answers, noise)
    totals, summary = _totals(runs, rows, stop_rows, answers, noise, default.label)
    every_point = rule_replay.aggregate([replace(r, family="all") for r in rows]).get("all", [])
    stop_points = [{"s": s, "compute": float(np.mean([(s * r["arms"] + 1 - s) / r["arms"] for r in mine])),
                    "regret_predicted": float(np.mean([r["regret_predicted"] for r in mine])),
                    "regret_current": float(np.mean([r["regret_current"] for r in mine]))}
                   for s in SHOWN_S if (mine := [r for r in stop_rows if r["s"] == s])]
    out.mkdir(parents=True, exist_ok=True)
    plot = plot_replay(every_point, stop_points, noise, out / "replay.png",
                       f"{len(runs.sweeps)} replayed sweep(s): mean regret against mean compute, a point per setting")
    result = {"source": runs.label, "predictor": predictor_words, "metric": runs.metric, "noise": noise,
              "noise_source": noise_words, "swept": list(runs.swept), "summary": summary,
              "sweeps": {name: {"runs": [c.meta["name"] for c in members],
                                "finals": {c.meta["name"]: c.final_loss for c in members},
                                "best": min(members, key=lambda c: c.final_loss).meta["name"],
                                "family": rule_replay.schedule_family(members[0])}
                         for name, members in runs.sweeps.items()},
              "rows": [asdict(r) for r in rows], "stop_at_s": stop_rows, "early_answers": answers,
              "settings": [asdict(p) for p in every_point], "no_sweep": runs.alone, "left_out": runs.notes,
              "seconds": time.monotonic() - started, **runs.extra}
    atomic_write_json(out / "replay.json", json_safe(result))
    print(f"replay of {runs.label}; predictor {predictor_words}; noise yardstick "
          + (f"{noise:.4f} ({noise_words})" if noise is not None else "none (within noise not judged)"), flush=True)
    print(table)
    if runs.alone:  # listed in full in replay.json
        print(f"no sweep: {len(runs.alone)} run(s) differ from every other in more than "
              f"{'/'.join(runs.swept)}: " + ", ".join(a.split(":")[0] for a in runs.alone[:3])
              + (" …" if len(runs.alone) > 3 else ""))
    for line in runs.notes:
        print(f"left out: {line}")
    print("\n".join(totals))
    print(f"every setting of every rule: {out / 'replay.json'}; regret against compute: {plot} "
          f"({time.monotonic() - started:.0f} s)")
    return result


def _table(runs: Runs, rows: Sequence[Any], stop_rows: Sequence[dict[str, Any]], answers: dict[str, Any],
           noise: Optional[float]) -> str:
    from hpo.common.tables import markdown_table

    def within(regret: Optional[float]) -> str:
        return "—" if regret is None or noise is None else ("yes" if regret <= noise + 1e-12 else "no")

    body = []
    for name, members in runs.sweeps.items():
        labels = {c.meta["name"]: _arm_label(c, members, runs.swept) for c in members}
        best = min(members, key=lambda c: c.final_loss)
        heading = [name, f"{len(members)} runs; best {labels[best.meta['name']]}", f"final {best.final_loss:.4f}"]
        mine = [r for r in rows if r.family == name]
        shown = [r for r in mine if r.default] + [r for m, label in SHOWN.items() for r in mine
                                                   if r.method == m and r.setting == label]
        lines = [[f"{r.method}{' (default)' if r.default else ''}: {r.setting}", _fmt(r.compute, ".2f"),
                  labels.get(r.pick, "—") if r.pick else "—", _fmt(r.regret), within(r.regret)] for r in shown]
        if name in answers:
            a = answers[name]
            lines.insert(1, [f"early answer of the default, at t̂ = {a['rung']:g}", _fmt(a["compute"], ".2f"),
                             labels[a["pick"]], _fmt(a["regret"]), within(a["regret"])])
        for s in SHOWN_S:
            stop = next((r for r in stop_rows if r["sweep"] == name and r["s"] == s), None)
            if stop is None:
                continue
            compute = (s * len(members) + 1 - s) / len(members)
            for rule, key in (("predicted-best", "predicted"), ("current-best", "current")):
                pick = stop["predicted_best" if key == "predicted" else "current_best"]
                lines.append([f"{rule} at s = {s:g}", _fmt(compute, ".2f"), labels[pick],
                              _fmt(stop[f"regret_{key}"]), within(stop[f"regret_{key}"])])
        body += [[heading[i] if i < len(heading) else "", *line] for i, line in enumerate(lines)]
    return markdown_table(["sweep", "rule: setting", "compute", "pick", "regret", "within noise"], body)


def _totals(runs: Runs, rows: Sequence[Any], stop_rows: Sequence[dict[str, Any]], answers: dict[str, Any],
            noise: Optional[float], default_label: str) -> tuple[list[str], dict[str, Any]]:
    from hpo.trials.rule_replay import stop_at_s_counts

    n = len(runs.sweeps)
    lines, summary = [f"over {n} sweep(s):"], {"sweeps": n, "stop_at_s": {}}
    if noise is not None:
        for s in SHOWN_S:
            pred, cur, m = stop_at_s_counts(stop_rows, s, noise)
            if m:
                lines.append(f"  every trial stopped at s = {s:g}: predicted-best within noise on {pred}/{m} sweeps, "
                             f"current-best on {cur}/{m}")
                summary["stop_at_s"][str(s)] = {"predicted_best_within": pred, "current_best_within": cur, "sweeps": m}
    shipped = [r for r in rows if r.default and r.regret is not None]
    if shipped:
        within = sum(bool(r.within_noise) for r in shipped)
        kept = sum(bool(r.best_kept) for r in shipped)
        compute = float(np.mean([r.compute for r in shipped]))
        lines.append(f"  the default ({default_label}): mean compute {compute:.2f}, within noise on "
                     f"{within}/{len(shipped)}, the true best kept on {kept}/{len(shipped)}")
        summary["default"] = {"setting": default_label, "compute": compute, "within": within, "kept": kept,
                              "sweeps": len(shipped)}
    if answers:
        lines.append(f"  its early answer: after {100 * np.mean([a['compute'] for a in answers.values()]):.0f}% of "
                     f"the compute on average, within noise on "
                     f"{sum(noise is not None and a['regret'] <= noise + 1e-12 for a in answers.values())}/{len(answers)}")
    return lines, summary


def add_parser(sub: Any) -> None:
    """``hpo replay`` on the CLI's subparsers."""
    parser = sub.add_parser("replay", help="what every keep rule would have done on finished sweeps (a curve file, "
                                           "a folder of training logs, an MLflow experiment, or `public`)")
    parser.add_argument("source", nargs="?", help="a curve file (CSV/parquet, the --from-curves format), a folder of "
                        "training logs (W&B run exports), or `public` (the packaged public 124M sweeps)")
    parser.add_argument("--from-mlflow", metavar="EXPERIMENT_ID", help="the runs of an MLflow experiment instead")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow")
    parser.add_argument("--metric", default="loss", help="the loss metric for --from-mlflow (default loss) or a log "
                        "folder (default val_loss)")
    parser.add_argument("--swept", metavar="COLUMN", help="group runs that differ only in this column (default: "
                        "η, B or λ)")
    parser.add_argument("--predictor", metavar="P", help="predictor JSON (default: the packaged one nearest the "
                        "runs' model size)")
    parser.add_argument("--quick", action="store_true", help="a few settings per rule instead of every setting")
    parser.add_argument("--output", metavar="DIR", help="where replay.json and replay.png go (default "
                        "runs/replay/public or runs/replay/sweeps)")
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    replay(args)
    return 0
