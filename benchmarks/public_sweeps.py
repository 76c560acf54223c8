"""Decisions at the scale users train: public 124M-parameter η sweeps replayed through every rule.

What: the training logs of a folder (W&B run exports, ``hpo.calibration.log_import``; the public
ones are ``../shared/public-curves/lr-scheduling/data``, packaged as ``hpo/data/curves``) are
split the paper's way:

* **calibration**: the runs of the size ladder below the bench (``--calibrate-max-params``,
  non-embedding N; by default the 33M–93M-parameter runs, N 14M–61M) on the bench's corpus; the
  predictor is fitted on them with the project's one fit (``hpo.calibration.fit.fit_and_report``);
* **bench**: the sweeps of the larger runs (runs of one experiment that differ only in η, same
  schedule and horizon: ``hpo.trials.replay.curve_sweeps``), decided on the validation loss;
* **noise**: the re-runs with identical settings (a sub-folder such as ``grad_norm/``); "within
  noise" is a regret ≤ the RMS of their final-loss differences.

Then, per sweep:

1. **stop at s** (0.1/0.2/0.3/0.5): predicted-best (lowest predicted final,
   ``predictors.prediction.predict_at_rung``) against current-best (lowest loss at s): within noise, better/worse
   than each other, the MAE of the predicted finals, the order error of predicted finals and of
   the losses at s (pairs of arms ordered as their true finals);
2. **the whole scheduler**: every setting of every rule of the keep-rule seam (collapse, ASHA,
   current-best at s, the paired test, Ray's median stopping; ``hpo.trials.rule_replay``, the
   engine ``hpo replay`` uses)
   replayed through ``CollapseScheduler`` on the sweep's curves; compute, regret, within noise,
   best kept; one row a sweep × method × setting in ``OUT/sweeps.json``;
3. **defaults held out by schedule family** (cosine / constant / WSD short cooldown ≤ 25% /
   WSD long cooldown / sqrt cooldown): for each family, the collapse setting chosen on the other
   families' sweeps (``benchmarks.decisions.select_default``), reported on that family only.

Run::

    python benchmarks/public_sweeps.py [--logs ../shared/public-curves/lr-scheduling/data] --out OUT
        [--predictor FILE] [--quick] [--md benchmarks/public_sweeps.md]

(without ``--logs``: the packaged copy of the same curves, ``hpo/data/curves``).

Writes ``OUT/sweeps.json``, ``OUT/stop_at_s.json``, ``OUT/predictor.json`` (and its calibration
report in ``OUT/calibration/``) and the markdown report.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.common.tables import markdown_table  # noqa: E402
from hpo.trials import rule_replay  # noqa: E402
from hpo.trials.rule_replay import FAMILIES, FRACTIONS, stop_at_s  # noqa: E402
from hpo.trials.rule_replay import schedule_family as family  # noqa: E402
from hpo.calibration.log_import import CALIBRATE_MAX_PARAMS, split  # noqa: E402
from predictors.io import atomic_write_json, atomic_write_text  # noqa: E402

def fit_predictor(curves: Sequence[Any], out: Path) -> Any:
    """The predictor fitted on ``curves`` with the project's one fit, on the validation loss over
    t̂ ∈ [0.1, 1]: the earliest rung the scheduler decides at, and after the first evaluation of
    the shortest ladder run (every 200 of 3,000 steps: t̂ 0.067)."""
    from hpo.calibration.fit import FitSettings, choose_offset, fit_and_report
    from predictors import Predictor

    path = out / "predictor.json"
    settings = FitSettings(t_min=0.1)
    offset, table = choose_offset(curves, settings)
    print("irreducible loss, chosen leave-one-size-out on the calibration runs: "
          + "; ".join(f"{form}: " + ", ".join(f"s {s:g} {100 * e:.2f}%" for s, e in errs.items())
                      for form, errs in table.items()) + f" -> {'fitted' if offset else 'L̂ = 0'}", flush=True)
    settings = FitSettings(t_min=0.1, irreducible_loss=offset)
    fit_and_report(list(curves), settings, path, out / "calibration",
                   provenance={"calibration": "public-ladder", "metric": "val_loss",
                               "curves": "fabian-sp/lr-scheduling@8ace3a327a396fbd4998ff7615d54012eba71573 data/ "
                                         "(MIT; hpo/data/curves/README.md): the 33M-93M SlimPajama ladder",
                               "irreducible_loss_choice": {"fitted": offset, "held_out_error": {
                                   form: {str(s): e for s, e in errs.items()} for form, errs in table.items()}}},
                   source="public lr-scheduling logs")
    return Predictor.load(path)


def replay_sweeps(predictor: Any, sweeps: dict[str, list[Any]], noise: float, quick: bool,
                  started: float) -> list[Any]:
    """Every setting of every method replayed on every sweep (``hpo.trials.rule_replay``)."""
    every = rule_replay.settings(predictor, quick=quick)
    return rule_replay.replay_sweeps(predictor, sweeps, noise, every=every, progress=lambda name, i, n: print(
        f"  {name}: {len(every)} settings [{i}/{n}, {time.monotonic() - started:.0f} s]", flush=True))


def held_out_by_family(rows: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """For each family: the collapse setting chosen on the others' sweeps, and the family's rows."""
    from benchmarks.decisions import select_default

    families = list(dict.fromkeys(r.bank for r in rows))
    out = {}
    for held in families:
        others = {f: [r for r in rows if r.bank == f] for f in families if f != held}
        chosen, why = select_default(others)
        out[held] = {"chosen": chosen, "why": why,
                     "rows": [r for r in rows if r.bank == held and r.method == "collapse" and r.setting == chosen]}
    return out


def _pct(a: int, b: int) -> str:
    return f"{a}/{b}"


def render(stop_rows: Sequence[dict[str, Any]], replay_rows: Sequence[Any], held: dict[str, dict[str, Any]],
           meta: dict[str, Any]) -> tuple[str, list[str]]:
    from benchmarks.decisions import equal_quality

    noise = meta["noise"]
    lines = ["# Public 124M sweeps: decisions at the scale users train", "",
             "Generated by `python benchmarks/public_sweeps.py` (its docstring defines every term) on "
             f"`{meta['logs']}`. Predictor: {meta['predictor']}. Noise yardstick: {noise:.4f} (RMS of the final "
             f"validation-loss differences of {meta['noise_pairs']} re-run pairs with identical settings); "
             f"{meta['n_sweeps']} sweeps, {meta['n_bench_runs']} runs at N = {meta['bench_sizes']}; "
             f"calibration: {meta['n_calibration']} runs at N = {meta['calibration_sizes']}.", ""]
    verdicts = []
    body = []
    for s in FRACTIONS:
        mine = [r for r in stop_rows if r["s"] == s]
        within_p = sum(r["regret_predicted"] <= noise + 1e-12 for r in mine)
        within_c = sum(r["regret_current"] <= noise + 1e-12 for r in mine)
        better = sum(r["regret_predicted"] < r["regret_current"] - 1e-12 for r in mine)
        worse = sum(r["regret_predicted"] > r["regret_current"] + 1e-12 for r in mine)
        far_worse = sum(r["regret_predicted"] > r["regret_current"] + noise + 1e-12 for r in mine)
        mae = float(np.mean([r["mae_predicted"] for r in mine])) if mine else math.nan
        pairs = sum(r["pairs"] for r in mine)
        body.append([f"{s:g}", _pct(within_p, len(mine)), _pct(within_c, len(mine)), f"{better} / {worse}",
                     str(far_worse), f"{100 * mae:.2f}%",
                     f"{sum(r['pairs_misordered_predicted'] for r in mine)}/{pairs}",
                     f"{sum(r['pairs_misordered_loss'] for r in mine)}/{pairs}"])
        if s == 0.3:
            verdicts.append(("MET" if within_p >= 22 and far_worse == 0 else "MISSED") +
                            f": predicted-best within noise at s = 0.3 on {within_p}/{len(mine)} sweeps (target ≥ 22 "
                            f"of 24, never worse than current-best by more than the noise: {far_worse} worse by more)")
            verdicts.append(("MET" if mae <= 0.006 else "MISSED") + f": MAE of predicted finals at s = 0.3 "
                            f"{100 * mae:.2f}% (target ≤ 0.6%)")
        if s == 0.2:
            verdicts.append(("MET" if within_p >= 20 else "MISSED") + f": predicted-best within noise at s = 0.2 "
                            f"on {within_p}/{len(mine)} (target ≥ 20)")
    lines += ["## Stop at s: predicted-best against current-best", "", markdown_table(
        ["s", "predicted-best within noise", "current-best within noise", "predicted better / worse",
         "predicted worse by > noise", "MAE of predicted finals", "pairs misordered: predicted", "pairs misordered: loss"],
        body), ""]
    body = []
    for fam in FAMILIES:
        for s in FRACTIONS:
            mine = [r for r in stop_rows if r["s"] == s and r["family"] == fam]
            if not mine:
                continue
            pairs = sum(r["pairs"] for r in mine)
            body.append([fam, f"{s:g}", len(mine),
                         _pct(sum(r["regret_predicted"] <= noise + 1e-12 for r in mine), len(mine)),
                         _pct(sum(r["regret_current"] <= noise + 1e-12 for r in mine), len(mine)),
                         f"{100 * np.mean([r['mae_predicted'] for r in mine]):.2f}%",
                         f"{sum(r['pairs_misordered_predicted'] for r in mine)}/{pairs}",
                         f"{sum(r['pairs_misordered_loss'] for r in mine)}/{pairs}"])
    lines += ["## Per schedule family (decision error and ranking error)", "", markdown_table(
        ["family", "s", "sweeps", "predicted-best within", "current-best within", "MAE predicted",
         "misordered: predicted", "misordered: loss"], body), ""]
    # The default, held out by schedule family.
    body, all_rows = [], []
    for fam, res in held.items():
        rows = res["rows"]
        all_rows += rows
        body.append([fam, f"`{res['chosen']}`", len(rows), f"{np.mean([r.compute for r in rows]):.3f}",
                     _pct(sum(bool(r.within_noise) for r in rows), len(rows)),
                     _pct(sum(bool(r.best_kept) for r in rows), len(rows))])
    n = len(all_rows)
    if n:
        kept = sum(bool(r.best_kept) for r in all_rows) / n
        within = sum(bool(r.within_noise) for r in all_rows) / n
        compute = float(np.mean([r.compute for r in all_rows]))
        verdicts += [("MET" if kept >= 0.95 else "MISSED") + f": held-out default keeps the best on {100 * kept:.0f}% "
                     "of sweeps (target ≥ 95%)",
                     ("MET" if within >= 0.90 else "MISSED") + f": held-out default within noise on {100 * within:.0f}% "
                     "(target ≥ 90%)",
                     ("MET" if compute <= 0.35 else "MISSED") + f": held-out default mean compute {compute:.3f} (target ≤ 0.35)"]
    lines += ["## The scheduler's default, held out by schedule family", "",
              "Each family's setting is the cheapest collapse setting safe (within noise ≥ 90%, best kept ≥ 95%) on "
              "every other family's sweeps; only the held-out family's figures are shown.", "", markdown_table(
                  ["held-out family", "setting chosen on the others", "sweeps", "mean compute", "within noise",
                   "best kept"], body), ""]
    # Equal-quality compute over the bench.
    methods = ("collapse", "current-best", "asha", "median", "paired-test", "top-k")
    found = {m: equal_quality(replay_rows, m) for m in methods}
    lines += ["## Equal-quality compute over the bench", "",
              "Each method's least mean compute among its settings that are safe on all sweeps (hindsight-best "
              "setting, the same rule for every method).", "", markdown_table(
                  ["method", "equal-quality compute", "setting"],
                  [[m, "—" if found[m] is None else f"{found[m][0]:.3f}", "—" if found[m] is None else f[1]]
                   for m, f in found.items()]), ""]
    body = []
    for m in methods:
        by: dict[str, list[Any]] = {}
        for r in replay_rows:
            if r.method == m and r.regret is not None:
                by.setdefault(r.setting, []).append(r)
        if not by:
            continue
        scored = [(sum(bool(r.within_noise) for r in v), -float(np.mean([r.compute for r in v])), k, v)
                  for k, v in by.items()]
        within, neg, label, rows = max(scored)
        ninety = [(-c, k, v) for w, c, k, v in scored if w >= 0.9 * len(v) - 1e-9]
        cheap = min(ninety) if ninety else None
        body.append([m, f"`{label}`", f"{within}/{len(rows)}", f"{sum(bool(r.best_kept) for r in rows)}/{len(rows)}",
                     f"{-neg:.3f}", "—" if cheap is None else f"`{cheap[1]}`: {cheap[0]:.3f}"])
    shipped = [r for r in replay_rows if r.default]
    if shipped:
        body.append(["collapse, shipped default", f"`{shipped[0].setting}`",
                     f"{sum(bool(r.within_noise) for r in shipped)}/{len(shipped)}",
                     f"{sum(bool(r.best_kept) for r in shipped)}/{len(shipped)}",
                     f"{np.mean([r.compute for r in shipped]):.3f}", ""])
    lines += ["Where no setting is safe, each method's best quality and what it costs: the setting within noise on "
              "the most sweeps (ties: the cheaper), and the cheapest within noise on ≥ 90% of them (best kept not "
              "required).", "", markdown_table(
                  ["method", "setting within on most sweeps", "within noise", "best kept", "mean compute",
                   "cheapest within ≥ 90%: compute"], body), ""]
    c, cb = found["collapse"], found["current-best"]
    if c and cb:
        ratio = c[0] / cb[0]
        verdicts.append(("MET" if ratio <= 0.6 else "MISSED") + f": equal-quality compute collapse ÷ current-best "
                        f"= {ratio:.2f}× (target ≤ 0.6×)")
    else:
        verdicts.append("MISSED: equal-quality compute ratio not measurable (a method has no safe setting: "
                        f"collapse {c}, current-best {cb})")
    lines += ["## Targets", "", *[f"- {v}" for v in verdicts], ""]
    return "\n".join(lines), verdicts


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", help="folder of run exports (W&B JSON); default: the packaged public curves "
                        "(hpo/data/curves, the same logs already imported)")
    parser.add_argument("--out", required=True, help="output folder (sweeps.json, stop_at_s.json, predictor.json)")
    parser.add_argument("--predictor", help="a predictor JSON to use instead of fitting one on the calibration runs")
    parser.add_argument("--calibrate-max-params", type=float, default=CALIBRATE_MAX_PARAMS,
                        help="non-embedding N at or below which a run calibrates (default 7e7)")
    parser.add_argument("--quick", action="store_true", help="a few settings per method (tests)")
    parser.add_argument("--md", help="markdown report to write (e.g. benchmarks/public_sweeps.md)")
    args = parser.parse_args(argv)
    from hpo.calibration.curve_import import CurveImportError
    from hpo.calibration.log_import import LogImportError, load_curve_bench, load_log_dir, rerun_spread
    from hpo.data import public_curves_path
    from hpo.trials.replay import curve_sweeps
    from predictors import Predictor

    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        logs = load_log_dir(args.logs) if args.logs else load_curve_bench(public_curves_path())
    except (LogImportError, CurveImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spread = rerun_spread(logs)
    if spread is None:
        print("error: no re-run with identical settings in the folder: the noise yardstick cannot be measured",
              file=sys.stderr)
        return 2
    noise = spread["rms_difference"]
    calibration, bench, corpus = split(logs, args.calibrate_max_params)
    sweeps, alone = curve_sweeps(bench)
    print(f"{len(logs.curves)} curves; calibration {len(calibration)}, bench {len(bench)} in {len(sweeps)} sweeps; "
          f"noise {noise:.4f} [{time.monotonic() - started:.0f} s]", flush=True)
    if args.predictor:
        predictor, source = Predictor.load(args.predictor), f"`{args.predictor}`"
    else:
        predictor = fit_predictor(calibration, out)
        source = f"fitted on the {len(calibration)} calibration runs (`{out / 'predictor.json'}`)"
    print(f"predictor ready [{time.monotonic() - started:.0f} s]", flush=True)
    stop_rows = stop_at_s(predictor, sweeps, noise)
    atomic_write_json(out / "stop_at_s.json", stop_rows)
    replay_rows = replay_sweeps(predictor, sweeps, noise, args.quick, started)
    held = held_out_by_family(replay_rows)
    chosen = {f: res["chosen"] for f, res in held.items()}
    atomic_write_json(out / "sweeps.json", [
        {"sweep": r.family, "family": r.bank, "method": r.method, "setting": r.setting,
         "default": r.method == "collapse" and r.setting == chosen.get(r.bank), "shipped_default": r.default,
         "compute": r.compute, "regret": r.regret, "within_noise": r.within_noise, "best_kept": r.best_kept,
         "pick": r.pick, "best": r.best, "arms": r.n_trials} for r in replay_rows])

    def sizes(curves: Sequence[Any]) -> str:
        return ", ".join(f"{n / 1e6:.0f}M" for n in sorted({c.controls.n_params for c in curves}))

    bench = [c for members in sweeps.values() for c in members]

    meta = {"logs": args.logs or "hpo/data/curves/public_lr_scheduling.parquet", "predictor": source, "noise": noise, "noise_pairs": len(spread["pairs"]),
            "n_sweeps": len(sweeps), "n_bench_runs": sum(len(v) for v in sweeps.values()),
            "bench_sizes": sizes(bench), "n_calibration": len(calibration), "calibration_sizes": sizes(calibration),
            "corpus": corpus, "alone": alone, "seconds": time.monotonic() - started}
    text, verdicts = render(stop_rows, replay_rows, held, meta)
    atomic_write_json(out / "meta.json", {**meta, "verdicts": verdicts, "held_out": {
        f: {"chosen": r["chosen"], "why": r["why"]} for f, r in held.items()}})
    if args.md:
        atomic_write_text(Path(args.md), text)
    print("\n".join(verdicts))
    print(f"done in {time.monotonic() - started:.0f} s; {out / 'sweeps.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
