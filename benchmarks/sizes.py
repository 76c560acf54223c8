"""Model size: predict the largest widths of the width ladder from the smaller ones, per method.

What: the width-ladder bank (``configs/calibration/width_ladder.yaml``: one family at TPP 20,
τ 0.4, two seeds per width) is split by model size N: the ``--held`` largest widths are held
out, the rest is the calibration. For each way model size can enter a prediction
(``hpo.calibration.fit.FitSettings.size_method``) the calibration is run exactly as ``hpo
calibrate`` runs it (``hpo.calibration.fit.fit_and_report``: fit, leave-one-out and cross-size
errors, the distance-aware error beyond the calibrated sizes) on the smaller widths only, and
the predictor it writes predicts every held-out run:

* ``surrogate``: the four-parameter surrogate, no size term (the "fixed surrogate");
* ``size term``: the surrogate with m(N) fitted (``predictors.surrogate``);
* ``reference curves, size-term trend``: the paper's §5 steps 2–3 (the calibrated normalised
  curve of matching controls, interpolated in log N), continued beyond the largest calibrated
  size along the size term (``predictors.references``);
* ``chosen``: ``size_method: choose``, the default: the calibration picks one of the above by
  leave-one-size-out on the smaller widths (what a user of ``hpo calibrate`` gets);
* ``nearest width``: reference curves held at the largest calibrated width (the naive rule:
  use the biggest model you calibrated on as the shape);
* ``oracle``: b and q free for each held-out curve (same m): the best the surrogate's shape
  can do (``predictors.fit.score_curves``), for the curve MAE only.

Scores per method, over the held-out runs: the MAE of ℓ over t̂ ∈ [t_min, 1] of the curve the
predictor draws for each run (``predictors.fit.score_curves``: the surrogate, or the reference
curves where they match), its ratio to the oracle, the mean |relative error| of the final loss
predicted from the first s of each curve (the rung cut, ``hpo.calibration.held_out.predict_at``), the share
of true finals inside the predictor's stated ±2σ, that ±2σ itself (mean, relative to the
final: a wide enough interval covers anything, so the two are read together) and its ratio to
the RMS error of the same predictions (band / RMS: about 2 when σ is the size of the error).

Extrapolation by distance: besides the headline split (the ``--held`` largest widths held out),
every split of the ladder into the k smallest widths (calibration) and the rest (predicted) is
run, k = 2 … n − 1 (``--splits``; a k whose calibration would hold fewer than 3 runs is
skipped), and each predicted run is binned by how far beyond the largest calibrated size it is (N / N_max: ≤ 2×, 2–4×, > 4×); per method and bin the same
scores, and the curve MAE against the oracle's on the same runs. Runs of several splits are
counted once per split: a width 2.2× beyond one calibration is 1.3× beyond the next.

Targets (issues 15, 28): at or below the nearest-width rule at every s (below it at s ≤ 0.3),
and a curve MAE ≤ 1.5× the oracle; ±2σ covering ≥ 90% when predicting 2–4× beyond the largest
calibrated size, with a band ≤ 2.5× the RMS error.

Predictors as they ship (``--predictors P ...``, issue 28): instead of calibrating, each given
predictor file predicts every run of the ladder as it is, per width: the same scores, and
whether the width is one of the predictor's calibrated sizes (its provenance): the shipped
one-size predictor against a calibration pooled across sizes. A predictor fitted on a width
predicts it in-sample; its held-out (leave-one-size-out) errors are in its calibration.md.

Run::

    python benchmarks/sizes.py [--config configs/calibration/width_ladder.yaml] [--held 2]
        [--splits K ...] [--md benchmarks/sizes.md]
    python benchmarks/sizes.py --predictors hpo/data/predictors/default.json CANDIDATE.json
        --md benchmarks/sizes_shipped.md
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration.calibrate import load_calibration_config  # noqa: E402
from hpo.calibration.fit import fit_and_report  # noqa: E402
from hpo.trials.curve_bank import bank_curves, load_bank, run_id_of  # noqa: E402
from hpo.calibration.held_out import predict_at  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from predictors import Predictor  # noqa: E402
from predictors.curves import Curve, curve_size  # noqa: E402
from predictors.fit import score_curves  # noqa: E402
from predictors.io import atomic_write_text  # noqa: E402

FRACTIONS = (0.1, 0.2, 0.3, 0.5)
#: (row label, FitSettings.size_method); the nearest-width rule is reference curves held at
#: the largest calibrated size ("hold" beyond the sizes, predictors.references).
METHODS = (
    ("surrogate (no size term)", "surrogate"),
    ("size term", "size term"),
    ("reference curves, size-term trend", "reference curves, size-term trend"),
    ("chosen by leave-one-size-out (what hpo calibrate ships)", "choose"),
    ("nearest width (reference curves, held)", "reference curves"),
)


def ladder_curves(config_path: str) -> list[Curve]:
    """The completed curves of the calibration's own runs in its bank."""
    config = load_calibration_config(config_path)
    frame = load_bank(config.bank)
    wanted = {run_id_of(c) for c in config.runs()}
    frame = frame[frame["run_id"].isin(wanted) & (frame["status"] == "completed")]
    return list(bank_curves(frame))


def predictions(predictor: Predictor, held: Sequence[Curve]) -> dict[float, list[tuple[float, bool, float]]]:
    """Per s, one (relative error of the final, inside the stated ±2σ, stated ±2σ relative to the
    final) for each run of ``held`` the predictor predicts from its first s."""
    out: dict[float, list[tuple[float, bool, float]]] = {s: [] for s in FRACTIONS}
    for curve in held:
        for s in FRACTIONS:
            pred = predict_at(predictor, curve, s)
            if pred is not None:
                out[s].append((pred.final_loss / curve.final_loss - 1.0,
                               abs(pred.final_loss - curve.final_loss) <= 2.0 * pred.uncertainty,
                               2.0 * pred.uncertainty / curve.final_loss))
    return out


def summarise(records: dict[float, list[tuple[float, bool, float]]]) -> dict[str, Any]:
    """Mean |error|, bias, ±2σ coverage and mean stated ±2σ at each s, and how many predictions."""

    def mean(f: Any) -> dict[float, float]:
        return {s: float(np.mean([f(r) for r in v])) if v else math.nan for s, v in records.items()}

    rms = {s: float(np.sqrt(np.mean([r[0] ** 2 for r in v]))) if v else math.nan for s, v in records.items()}
    out = {"mean_abs": mean(lambda r: abs(r[0])), "bias": mean(lambda r: r[0]), "coverage": mean(lambda r: r[1]),
           "two_sigma": mean(lambda r: r[2]), "rms": rms, "n": {s: len(v) for s, v in records.items()}}
    # The band against the error it states: mean stated ±2σ over the RMS error (target ≤ 2.5).
    out["band_ratio"] = {s: out["two_sigma"][s] / rms[s] if rms[s] > 0 else math.nan for s in records}
    return out


def score_method(predictor: Predictor, held: Sequence[Curve]) -> dict[str, Any]:
    """:func:`summarise` of the predictions of ``held``."""
    return summarise(predictions(predictor, held))


def calibrate(config: Any, calib: Sequence[Curve], method: str, source: str) -> Predictor:
    """The predictor ``hpo calibrate`` writes for ``calib`` with ``size_method = method``."""
    settings = config.fit.model_copy(update={"size_method": method, "compare_fixed_m": False,
                                             "ranking_error": False})
    with tempfile.TemporaryDirectory() as tmp:
        fit_and_report(calib, settings, Path(tmp) / "p.json", Path(tmp) / "out",
                       provenance={"calibration": "sizes benchmark"}, source=source)
        return Predictor.load(Path(tmp) / "p.json")


#: Distance bins of a predicted width: N / (largest calibrated N).
BINS = (("≤ 2×", 0.0, 2.0), ("2–4×", 2.0, 4.0 + 1e-9), ("> 4×", 4.0 + 1e-9, math.inf))


def by_distance(fitted: dict[int, dict[str, Predictor]], curves: Sequence[Curve],
                sizes: Sequence[float], t_min: float) -> dict[str, dict[str, Any]]:
    """Per method and distance bin, :func:`summarise` of every prediction made by the split
    predictors ``fitted[k][label]`` (calibrated on the k smallest widths) of the larger widths,
    with the mean curve MAE of those runs (``mae``) and its ratio to the oracle's (b, q free per
    curve with the m of the split's size-term fit; ``ratio``)."""
    pooled: dict[str, dict[str, dict[float, list[Any]]]] = {
        label: {b: {s: [] for s in FRACTIONS} for b, _, _ in BINS} for label, _ in METHODS}
    maes: dict[str, dict[str, list[float]]] = {label: {b: [] for b, _, _ in BINS} for label, _ in METHODS}
    oracle: dict[str, list[float]] = {b: [] for b, _, _ in BINS}
    size_term = next(label for label, method in METHODS if method == "size term")
    for k, by_label in fitted.items():
        beyond = [c for c in curves if curve_size(c) in sizes[k:]]
        for label, predictor in by_label.items():
            scores = score_curves(predictor, beyond, t_min=t_min)
            for name, lo, hi in BINS:
                inside = [i for i, c in enumerate(beyond) if lo < curve_size(c) / sizes[k - 1] <= hi]
                for s, records in predictions(predictor, [beyond[i] for i in inside]).items():
                    pooled[label][name][s] += records
                maes[label][name] += [float(scores.curve_mae[i]) for i in inside]
                if label == size_term:
                    oracle[name] += [float(scores.oracle_curve_mae[i]) for i in inside]
    out: dict[str, dict[str, Any]] = {}
    for label, bins in pooled.items():
        out[label] = {}
        for name, records in bins.items():
            if not any(records.values()):
                continue
            row = summarise(records)
            row["mae"] = float(np.mean(maes[label][name]))
            row["ratio"] = row["mae"] / float(np.mean(oracle[name])) if oracle[name] else math.nan
            out[label][name] = row
    return out


def predictors_report(paths: Sequence[str], curves: Sequence[Curve], config_path: str, bank: str) -> str:
    """The ``--predictors`` section: per predictor file and ladder width, :func:`score_method`
    of that width's runs, and whether the width is a calibrated size of the predictor."""
    sizes = sorted({curve_size(c) for c in curves if curve_size(c)})
    fr = " / ".join(f"{s:g}" for s in FRACTIONS)

    def cells(r: dict[str, Any]) -> list[str]:
        return [" / ".join("n/a" if not math.isfinite(r[key][s]) else fmt(r[key][s]) for s in FRACTIONS)
                for key, fmt in (("mean_abs", lambda v: f"{100 * v:.2f}%"), ("coverage", lambda v: f"{100 * v:.0f}%"),
                                 ("two_sigma", lambda v: f"{100 * v:.1f}%"), ("band_ratio", lambda v: f"{v:.1f}×"))]

    rows = []
    for path in paths:
        predictor = Predictor.load(path)
        provenance = predictor.provenance or {}
        calibrated = [float(n) for n in provenance.get("model_sizes", [])]
        # The ladder's own runs are in the fit when its bank is one the calibration read.
        in_fit = str(bank) in {str(provenance.get("bank")), *map(str, provenance.get("extra_banks", []))}
        for n in sizes:
            mine = [c for c in curves if curve_size(c) == n]
            size_known = any(abs(n / m - 1.0) <= 0.01 for m in calibrated)
            where = ("yes, these runs (in-sample)" if size_known and in_fit else "yes, other runs" if size_known
                     else "no")
            rows.append([f"`{path}`" if n == sizes[0] else "", f"{n:,.0f}", where,
                         *cells(score_method(predictor, mine))])
        rows.append(["", "all widths", "", *cells(score_method(predictor, curves))])
    table = markdown_table(["predictor", "ladder N", "a calibrated size", f"mean |err| of final, s = {fr}",
                            f"±2σ coverage, s = {fr}", f"stated ±2σ (mean), s = {fr}",
                            f"±2σ / RMS error, s = {fr}"], rows)
    return "\n".join([
        "# Model size: predictors as they ship, on the width ladder", "",
        f"Generated by `python benchmarks/sizes.py --predictors {' '.join(paths)}` (see its docstring). Bank "
        f"`{config_path}`: {len(curves)} completed runs. Each predictor predicts every run as it ships; a width it "
        "was calibrated on is predicted in-sample (its held-out errors per size are in its calibration.md).", "",
        table, ""])


def _pct(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{100 * v:.2f}%"


def _ratio(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.1f}×"


FR = " / ".join(f"{s:g}" for s in FRACTIONS)


def headline_scores(predictors: dict[str, Predictor], held: Sequence[Curve], held_sizes: Sequence[float],
                    t_min: float) -> dict[str, dict[str, Any]]:
    """Per method, :func:`score_method` of the held-out runs, the curve MAE of the curve its
    predictor draws for them (reference curves included), its ratio to the oracle's (b, q free
    per curve with the size-term fit's m(N)) and the scores per held-out width."""
    oracle_mae = math.nan
    results: dict[str, dict[str, Any]] = {}
    for label, method in METHODS:
        predictor = predictors[label]
        scored = score_method(predictor, held)
        scores = score_curves(predictor, held, t_min=t_min)
        mae = float(np.mean(scores.curve_mae))
        if method == "size term":
            oracle_mae = float(np.mean(scores.oracle_curve_mae))
        scored.update(mae=mae, size_method=predictor.size_method,
                      per_size={n: score_method(predictor, [c for c in held if curve_size(c) == n])
                                for n in held_sizes})
        results[label] = scored
    for r in results.values():
        r["ratio"] = r["mae"] / oracle_mae if oracle_mae > 0 else math.inf
        r["oracle_mae"] = oracle_mae
    return results


def _headline_table(results: dict[str, dict[str, Any]]) -> str:
    naive = results[METHODS[-1][0]]["mean_abs"]
    method_of = dict(METHODS)
    rows = []
    for label, _ in METHODS:
        r = results[label]
        beats = all(r["mean_abs"][s] <= naive[s] + 1e-12 for s in FRACTIONS)
        if method_of[label] == "choose":
            label = f"{label}: {r['size_method']}"
        rows.append([label, _pct(r["mae"]), "n/a" if not math.isfinite(r["ratio"]) else f"{r['ratio']:.2f}×",
                     " / ".join(_pct(r["mean_abs"][s]) for s in FRACTIONS),
                     " / ".join(f"{100 * r['bias'][s]:+.2f}%" for s in FRACTIONS),
                     " / ".join(_pct(r["coverage"][s]) for s in FRACTIONS),
                     " / ".join(_pct(r["two_sigma"][s]) for s in FRACTIONS),
                     " / ".join(_ratio(r["band_ratio"][s]) for s in FRACTIONS),
                     "yes" if beats else "no"])
    oracle_mae = next(iter(results.values()))["oracle_mae"]
    rows.append(["oracle (b, q free per curve; m of the size-term fit)", _pct(oracle_mae), "1.00×", "", "", "", "", "",
                 ""])
    return markdown_table(["method", "curve MAE", "× oracle (target ≤ 1.5×)", f"mean |err| of final, s = {FR}",
                           f"bias, s = {FR}", f"±2σ coverage, s = {FR}", f"stated ±2σ (mean), s = {FR}",
                           f"±2σ / RMS error (target ≤ 2.5×), s = {FR}", "≤ nearest width at every s"], rows)


def _per_size_table(results: dict[str, dict[str, Any]], held_sizes: Sequence[float], calib_max: float) -> str:
    size_rows = []
    for label, _ in METHODS:
        for n in held_sizes:
            r = results[label]["per_size"][n]
            size_rows.append([label if n == held_sizes[0] else "", f"{n:,.0f} ({n / calib_max:.1f}×)",
                              " / ".join(_pct(r["mean_abs"][s]) for s in FRACTIONS),
                              " / ".join(_pct(r["coverage"][s]) for s in FRACTIONS),
                              " / ".join(_pct(r["two_sigma"][s]) for s in FRACTIONS)])
    return markdown_table(["method", "held-out N (× largest calibrated)", f"mean |err| of final, s = {FR}",
                           f"±2σ coverage, s = {FR}", f"stated ±2σ (mean), s = {FR}"], size_rows)


def _distance_table(distance: dict[str, dict[str, Any]]) -> str:
    distance_rows = []
    for label, _ in METHODS:
        for i, (name, _, _) in enumerate(b for b in BINS if b[0] in distance[label]):
            r = distance[label][name]
            distance_rows.append([label if i == 0 else "", name, str(max(r["n"].values())),
                                  " / ".join(_pct(r["mean_abs"][s]) for s in FRACTIONS),
                                  f"{_pct(r['mae'])} ({_ratio(r['ratio'])})",
                                  " / ".join(_pct(r["coverage"][s]) for s in FRACTIONS),
                                  " / ".join(_pct(r["two_sigma"][s]) for s in FRACTIONS),
                                  " / ".join(_ratio(r["band_ratio"][s]) for s in FRACTIONS)])
    return markdown_table(["method", "N / largest calibrated N", "predictions per s",
                           f"mean |err| of final, s = {FR}", "curve MAE (× oracle)",
                           f"±2σ coverage, s = {FR}", f"stated ±2σ (mean), s = {FR}",
                           f"±2σ / RMS error, s = {FR}"], distance_rows)


def _misses(fitted: dict[int, dict[str, Predictor]], curves: Sequence[Curve], sizes: Sequence[float]) -> str:
    """Every prediction of the shipped choice at 2–4× whose true final fell outside its ±2σ."""
    chosen = next(label for label, method in METHODS if method == "choose")
    miss_rows = []
    for k, by_label in fitted.items():
        for c in curves:
            ratio = curve_size(c) / sizes[k - 1]
            if not (2.0 < ratio <= 4.0 + 1e-9):
                continue
            for s in FRACTIONS:
                pred = predict_at(by_label[chosen], c, s)
                if pred is not None and abs(pred.final_loss - c.final_loss) > 2.0 * pred.uncertainty:
                    miss_rows.append([str(k), f"{curve_size(c):,.0f} ({ratio:.1f}×)", str(c.meta.get("seed", "")),
                                      f"{s:g}", f"{100 * (pred.final_loss / c.final_loss - 1):+.2f}%",
                                      f"±{100 * 2 * pred.uncertainty / c.final_loss:.2f}%"])
    return (markdown_table(["calibrated on the k smallest", "predicted N", "seed", "s", "error of final",
                            "stated ±2σ"], miss_rows) if miss_rows else "none")


#: The stop fractions the targets judge the default's error at (the decision fractions).
TARGET_FRACTIONS = (0.1, 0.2, 0.3)


def pooled_scores(fitted: dict[int, dict[str, Predictor]], curves: Sequence[Curve],
                  sizes: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Per method, :func:`summarise` of every prediction of every split (the predictors
    calibrated on the k smallest widths predicting every larger width), with ``target_mae``:
    the mean over s ≤ 0.3 of the mean |error| of the final."""
    out: dict[str, dict[str, Any]] = {}
    for label, _ in METHODS:
        records: dict[float, list[Any]] = {s: [] for s in FRACTIONS}
        for k, by_label in fitted.items():
            beyond = [c for c in curves if curve_size(c) in sizes[k:]]
            for s, r in predictions(by_label[label], beyond).items():
                records[s] += r
        row = summarise(records)
        row["target_mae"] = float(np.mean([row["mean_abs"][s] for s in TARGET_FRACTIONS]))
        out[label] = row
    return out


def _targets_table(pooled: dict[str, dict[str, Any]], chosen_names: Sequence[str]) -> str:
    """The targets, on every prediction of every split: the default's MAE at s ≤ 0.3 against the
    best single method (≤ 1.2×) and the nearest width at every s (never worse), ±2σ coverage
    (≥ 90%) and ±2σ / RMS (≤ 3) at every s."""
    method_of = dict(METHODS)
    chosen = next(label for label, m in METHODS if m == "choose")
    naive = pooled[METHODS[-1][0]]
    singles = {label: r for label, r in pooled.items() if method_of[label] != "choose"}
    best = min(singles, key=lambda label: singles[label]["target_mae"])
    rows = []
    for label, _ in METHODS:
        r = pooled[label]
        name = f"{label}: {', '.join(chosen_names)}" if label == chosen else label
        worse = [s for s in FRACTIONS if r["mean_abs"][s] > naive["mean_abs"][s] + 1e-12]
        rows.append([name, str(max(r["n"].values())), " / ".join(_pct(r["mean_abs"][s]) for s in FRACTIONS),
                     _pct(r["target_mae"]), f"{r['target_mae'] / singles[best]['target_mae']:.2f}×",
                     "yes" if not worse else "no (s = " + ", ".join(f"{s:g}" for s in worse) + ")",
                     " / ".join(_pct(r["coverage"][s]) for s in FRACTIONS),
                     " / ".join(_ratio(r["band_ratio"][s]) for s in FRACTIONS)])
    return markdown_table(["method", "predictions per s", f"mean |err| of final, s = {FR}",
                           "MAE at s ≤ 0.3", f"÷ best single method ({best}; target ≤ 1.2× for the default)",
                           "≤ nearest width at every s", f"±2σ coverage (target ≥ 90%), s = {FR}",
                           f"±2σ / RMS error (target ≤ 3×), s = {FR}"], rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/calibration/width_ladder.yaml")
    p.add_argument("--held", type=int, default=2, help="how many of the largest widths to hold out")
    p.add_argument("--splits", type=int, nargs="+",
                   help="calibrate on the k smallest widths for each k given (default: every k from 2 to "
                        "n − 1; the headline split n − held is always run)")
    p.add_argument("--md", default="benchmarks/sizes.md")
    p.add_argument("--predictors", nargs="+", metavar="JSON",
                   help="score these predictor files as they ship on every ladder width (no calibration)")
    args = p.parse_args(argv)
    started = time.monotonic()
    config = load_calibration_config(args.config)
    curves = ladder_curves(args.config)
    if args.predictors:
        missing = [path for path in args.predictors if not Path(path).is_file()]
        if missing:
            print(f"sizes: --predictors: {missing[0]}: no such file", file=sys.stderr)
            return 2
        text = predictors_report(args.predictors, curves, args.config, config.bank)
        atomic_write_text(args.md, text)
        print(text)
        return 0
    sizes = sorted({curve_size(c) for c in curves if curve_size(c)})
    if len(sizes) < args.held + 2:
        print(f"sizes: {len(sizes)} widths banked ({sizes}); need {args.held + 2} to hold out {args.held} "
              f"and calibrate on 2 (train the rest: hpo calibrate {args.config})", file=sys.stderr)
        return 2
    held_sizes = sizes[-args.held:]
    calib = [c for c in curves if curve_size(c) not in held_sizes]
    held = [c for c in curves if curve_size(c) in held_sizes]
    calib_max = max(s for s in sizes if s not in held_sizes)
    # Every method calibrated once per split (the headline split n − held among them).
    headline = len(sizes) - args.held
    # A calibration needs 3 complete curves: with one seed a width, the split on the 2 smallest has 2.
    enough = [k for k in range(2, len(sizes)) if sum(curve_size(c) in sizes[:k] for c in curves) >= 3]
    splits = sorted(set(args.splits or enough) | {headline})
    fitted: dict[int, dict[str, Predictor]] = {}
    for k in splits:
        part = [c for c in curves if curve_size(c) in sizes[:k]]
        fitted[k] = {label: calibrate(config, part, method, args.config) for label, method in METHODS}
        print(f"  split: calibrated on the {k} smallest widths [{time.monotonic() - started:.0f} s]", flush=True)
    results = headline_scores(fitted[headline], held, held_sizes, config.fit.t_min)
    chosen_label = next(label for label, method in METHODS if method == "choose")
    distance = by_distance(fitted, curves, sizes, config.fit.t_min)
    table = _headline_table(results)
    split_text = ", ".join(f"{k} ({', '.join(f'{n:,.0f}' for n in sizes[:k])})" for k in splits)
    widths = sorted({(int(c.meta.get('d_model', 0)), curve_size(c)) for c in curves})
    planned = sorted({int(r.get("model", {}).get("d_model", 0)) for r in config.runs()})
    missing = [d for d in planned if d not in {w for w, _ in widths}]
    missing_text = (f" Configured but not banked yet: d {', '.join(map(str, missing))} (`hpo calibrate {args.config}` "
                    "trains them); the held-out widths are the largest banked ones." if missing else "")
    text = "\n".join([
        "# Model size: extrapolating to the largest widths", "",
        f"Generated by `python benchmarks/sizes.py --config {args.config} --held {args.held}` (see its docstring "
        f"for every definition). Bank `{config.bank}`: {len(curves)} completed runs, widths "
        + ", ".join(f"d {d} (N {n:,.0f})" for d, n in widths) + "." + missing_text, "",
        f"Calibrated on N ≤ {calib_max:,.0f} ({len(calib)} runs); predicted: "
        f"N = {', '.join(f'{s:,.0f}' for s in held_sizes)} ({len(held)} runs), up to {max(held_sizes) / calib_max:.1f}× "
        "beyond the largest calibrated size. Errors are (predicted − true) / true final loss from the first s of each "
        "run; coverage is the share of true finals inside the stated ±2σ.", "",
        table, "",
        "Per held-out width (each row: that width's runs only; the distance-aware error states a larger ±2σ for "
        "the farther width):", "",
        _per_size_table(results, held_sizes, calib_max), "",
        "## Targets, over every split", "",
        f"Every prediction of every split below (k = {', '.join(map(str, splits))} smallest widths calibrated, "
        "every larger width predicted): the default's MAE of the final at s ≤ 0.3 (mean over s = 0.1, 0.2, 0.3) "
        "against the best single method's and the nearest width's, and its bands.", "",
        _targets_table(pooled_scores(fitted, curves, sizes),
                       sorted({by_label[chosen_label].size_method for by_label in fitted.values()})), "",
        "## Coverage by distance beyond the calibrated sizes", "",
        f"Every split of the ladder into the k smallest widths (calibration) and the larger ones (predicted), "
        f"k = {split_text}; each predicted run binned by N / the largest calibrated N. A run predicted from "
        "several splits counts once per split. Target: ±2σ covers ≥ 90% at 2–4×.", "",
        _distance_table(distance), "",
        "Predictions of the shipped choice at 2–4× outside their stated ±2σ:", "",
        _misses(fitted, curves, sizes), ""])
    atomic_write_text(args.md, text)
    print(table)
    print(f"wrote {args.md} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
