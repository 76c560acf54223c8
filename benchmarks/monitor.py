"""Collapse-residual monitor benchmark -> benchmarks/monitor.md + monitor.png.

    nice -n 10 python benchmarks/monitor.py [--cache FILE] [--max-runs K]

Every completed curve of every shipped bank (configs/calibration/*_bank.parquet), grouped into
cells of one corpus and one model size. For each cell, in both modes of ``hpo monitor``:

* **predictor mode**: each run against the shipped predictor, with its predictor-mode band
  (measured by ``hpo calibrate`` on the stdlib calibration runs, each judged by its
  leave-one-out refit, and on the runs of its ``corpus_banks``, Perl and C headers), and with a
  leave-one-corpus-out band (measured on the other corpora's runs only): the figure for a
  corpus no band saw;
* **reference mode** (the paper's way): each run against the runs of the same controls (τ, TPP,
  N, schedule) and *another seed*, as ``hpo monitor --reference FILE`` judges it: with the
  spread of those reference runs where the file holds ≥ 2 of them, else the stored
  reference-mode band (pairs of calibration runs of another seed).

Measured per cell: false alarms on the clean runs; the clean spread at t̂ 0.8 (σ over the runs
of r, the residual, and of d, its change after the alignment window: what the detector
judges); and the **operating characteristic**: the smallest drift (in % of the loss by the end,
rising linearly from t̂ 0.5) caught in ≥ 90% of the runs by t̂ 0.8, for the monitor and the peer
rules (an alarm the clean copy raises by then too is not a catch). The drift is multiplied into the logged interval losses and the smoothed
loss recomputed with the run's own trailing window; peer rules see the interval losses, the
monitor the smoothed loss. An alarm before t̂ 0.5 is a false alarm, never a catch. Real trainer
faults: the curves benchmarks/monitor_faults.py banked in benchmarks/monitor_faults.csv. The section
at real scale (public 124M runs) is benchmarks/monitor_public.py's; this script keeps it as it is.
``--cache FILE`` keeps the measurements, so the tables and figure can be redrawn in seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from hpo.data import default_predictor_path
from hpo.trials.curve_bank import load_bank, smoothing_window_of
from predictors import Controls, Curve, Predictor
from predictors.monitor import monitor_curve, same_controls
from predictors.smoothing import trailing_mean

OUT = Path(__file__).with_suffix(".md")
FAULTS_CSV = Path(__file__).with_name("monitor_faults.csv")

#: The drift starts here and must be caught by CAUGHT_BY (the targets' "within 0.3 of t̂").
DRIFT_START, CAUGHT_BY = 0.5, 0.8
#: Drifts tried, in % of the loss by the end of training (+0.6 of it by t̂ 0.8).
DRIFTS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0, 30.0)
#: Banks on corpora other than the stdlib one the shipped predictor was calibrated on.
CORPUS_OF_BANK = {"decisions_perl": "Perl 5.36", "decisions_cheaders": "Linux C headers"}
#: Banks the shipped predictor (configs/calibration/default_sizes.yaml) was calibrated on.
CALIBRATION_BANKS = ("default", "width_ladder")


# --- Peer rules (our re-implementations, vectorised): first alarm t̂ or None --------------------

def _first(flags: np.ndarray, t: np.ndarray) -> Optional[float]:
    idx = np.flatnonzero(flags)
    return None if idx.size == 0 else float(t[idx[0]])


def _trailing(y: np.ndarray, window: int) -> np.ndarray:
    """Windows of the ``window`` values before each point (row i: y[i-window:i]), from i = window."""
    return sliding_window_view(y[:-1], window)


def megatron(t: np.ndarray, y: np.ndarray) -> Optional[float]:  # loss above 10x the largest seen
    return _first(np.r_[False, y[1:] > 10 * np.maximum.accumulate(y)[:-1]], t)


def foundry(t: np.ndarray, y: np.ndarray, window: int = 100, factor: float = 2.0, patience: int = 4) -> Optional[float]:
    """Loss >= 2x its running mean (last <= 100 values) for more than 4 points in a row."""
    csum = np.r_[0.0, np.cumsum(y)]
    i = np.arange(1, y.size)
    lo = np.maximum(0, i - window)
    above = np.r_[False, y[1:] >= factor * (csum[i] - csum[lo]) / (i - lo)]
    run = np.zeros(y.size, int)
    for k in np.flatnonzero(above):  # run lengths of consecutive exceedances
        run[k] = run[k - 1] + 1 if k else 1
    return _first(run > patience, t)


def lightning(t: np.ndarray, y: np.ndarray, window: int = 10) -> Optional[float]:  # |x - mean| >= 2 mean
    if y.size <= window:
        return None
    mean = _trailing(y, window).mean(axis=1)
    return _first(np.r_[np.zeros(window, bool), np.abs(y[window:] - mean) >= 2 * mean], t)


def zscore(t: np.ndarray, y: np.ndarray, window: int = 30, z: float = 3.0) -> Optional[float]:
    if y.size <= window:
        return None
    w = _trailing(y, window)
    mean, std = w.mean(axis=1), w.std(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        flags = (std > 0) & ((y[window:] - mean) / std > z)
    return _first(np.r_[np.zeros(window, bool), flags], t)


def mad(t: np.ndarray, y: np.ndarray, window: int = 21, z: float = 6.0) -> Optional[float]:
    if y.size <= window:
        return None
    w = _trailing(y, window)
    m = np.median(w, axis=1)
    s = 1.4826 * np.median(np.abs(w - m[:, None]), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        flags = (s > 0) & (np.abs(y[window:] - m) / s > z)
    return _first(np.r_[np.zeros(window, bool), flags], t)


def trend(t: np.ndarray, s: np.ndarray, lookback: float = 0.1, tol: float = 0.01, span: float = 0.05) -> Optional[float]:
    """Smoothed loss above its own trend: a line fitted to log L over the previous 0.1 of t̂ (up
    to 0.02 before the point), extrapolated; alarm when L exceeds it by > 1% for 0.05 of t̂
    (judged after t̂ 0.3)."""
    x, v = t, np.log(s)
    cx, cv, cxx, cxv = (np.r_[0.0, np.cumsum(a)] for a in (x, v, x * x, x * v))
    lo = np.searchsorted(t, t - lookback - 0.02, side="left")
    hi = np.searchsorted(t, t - 0.02, side="left")
    n = hi - lo
    sx, sv, sxx, sxv = (c[hi] - c[lo] for c in (cx, cv, cxx, cxv))
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (n * sxv - sx * sv) / (n * sxx - sx * sx)
        above = (t >= 0.3) & (n >= 3) & (s > np.exp((sv - slope * sx) / n + slope * t) * (1 + tol))
    since = None
    for i in np.flatnonzero(t >= 0.3):
        if above[i]:
            since = t[i] if since is None else since
            if t[i] - since >= span:
                return float(t[i])
        else:
            since = None
    return None


PEERS: dict[str, Callable[[np.ndarray, np.ndarray], Optional[float]]] = {
    "Megatron 10x max": megatron, "Foundry KillLossSpike": foundry, "Lightning SpikeDetection": lightning,
    "z-score (30)": zscore, "median/MAD (21, 6)": mad}
TREND = "smoothed loss above own trend"
MONITOR = "collapse monitor"
LOCO = "leave-one-corpus-out band"
NAMES = [MONITOR, *PEERS, TREND]


# --- Runs ---------------------------------------------------------------------------------------

def drift(amount: float) -> Callable[[np.ndarray], np.ndarray]:
    """×(1 + amount·(t̂ − 0.5)₊/0.5): +amount by the end, +0.6·amount at t̂ 0.8."""
    return lambda t: 1.0 + amount * np.clip((t - DRIFT_START) / (1.0 - DRIFT_START), 0.0, None)


def load_runs(max_runs: Optional[int]) -> list[dict[str, Any]]:
    """Every completed banked run: its bank, corpus, controls, seed, interval losses and
    smoothing window. ``max_runs``: at most that many per (bank, N), evenly spaced by run id."""
    runs = []
    for path in sorted(glob.glob("configs/calibration/*_bank.parquet")):
        bank = Path(path).stem.replace("_bank", "")
        frame = load_bank(path)
        kept: dict[float, int] = {}
        for run_id, rows in sorted(frame.groupby("run_id"), key=lambda kv: str(kv[0])):
            first = rows.iloc[0]
            if first["status"] != "completed":
                continue
            rows = rows.sort_values("train_fraction")
            rows = rows[(rows["train_fraction"] > 0) & np.isfinite(rows["train_loss"])]
            n = float(first["n_params"])
            if max_runs is not None and kept.get(n, 0) >= max_runs:
                continue
            kept[n] = kept.get(n, 0) + 1
            c = Controls.from_mapping(first.to_dict())
            runs.append({
                "bank": bank, "corpus": CORPUS_OF_BANK.get(bank, "stdlib"), "id": str(run_id),
                "controls": Controls(c.tau, c.tokens_per_param, c.schedule, n), "seed": str(first["seed"]),
                "t": rows["train_fraction"].to_numpy(float), "raw": rows["train_loss"].to_numpy(float),
                "tokens": rows["tokens"].to_numpy(float), "window": smoothing_window_of(first.to_dict())})
    return runs


def cell_of(run: dict[str, Any], calibrated_tpp: set[float]) -> str:
    """Corpus, N and TPP (the runs the shipped predictor was fitted on marked: its calibration's
    banks at the TPPs it was calibrated at)."""
    n = run["controls"].n_params
    size = f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"
    fitted = run["bank"] in CALIBRATION_BANKS and float(run["controls"].tokens_per_param) in calibrated_tpp
    where = " (calibration runs)" if fitted else ""
    return f"{run['corpus']}, N {size}, TPP {run['controls'].tokens_per_param:g}{where}"


def _curve(run: dict[str, Any], factor: Callable[[np.ndarray], np.ndarray]) -> Curve:
    s = trailing_mean(run["tokens"], run["raw"] * factor(run["t"]), run["window"])
    return Curve(run["t"], s, run["controls"], {"name": run["id"], "seed": run["seed"], "n_params": run["controls"].n_params})


def partners(runs: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Per run: the runs of the same controls and another seed (its reference runs)."""
    curves = [_curve(r, np.ones_like) for r in runs]
    out: dict[int, list[int]] = {}
    for i, a in enumerate(runs):
        out[i] = [j for j, b in enumerate(runs) if j != i and b["seed"] != a["seed"]
                  and a["bank"] == b["bank"] and same_controls(curves[i], curves[j])]
    return out


# --- Measurements -------------------------------------------------------------------------------

def _at(t: np.ndarray, values: np.ndarray, x: float) -> Optional[float]:
    ok = np.isfinite(values)
    if not ok.any() or t[ok][-1] < x - 0.02:
        return None
    return float(np.interp(x, t[ok], values[ok]))


def corpus_bands(predictor: Predictor, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per corpus: the predictor-mode band measured on the clean runs of every *other* corpus
    against the shipped predictor (``predictors.monitor.calibrate_band``): leave-one-corpus-out,
    so a corpus is judged with a band that never saw it."""
    from predictors.monitor import calibrate_band

    out = {}
    for corpus in sorted({r["corpus"] for r in runs}):
        others = [_curve(r, np.ones_like) for r in runs if r["corpus"] != corpus]
        names = sorted({r["corpus"] for r in runs if r["corpus"] != corpus})
        try:
            out[corpus] = calibrate_band(others, predictor, source=f"{len(others)} clean runs of {', '.join(names)}")
        except ValueError:
            continue
    return out


def measure(predictor: Predictor, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run: clean alarms (every detector, both modes), r and d at t̂ 0.8, and the first
    alarm of every detector on each drifted copy (monitor: both modes, and in predictor mode
    with the shipped band and with the leave-one-corpus-out band)."""
    from hpo.monitor.command import ReferenceBands, monitor_runs
    from predictors.references import ReferenceCurves

    band = predictor.monitor_band
    calibrated_tpp = {float(x) for x in predictor.provenance.get("tokens_per_param", [])}
    loco = corpus_bands(predictor, runs)
    refs_of = partners(runs)
    out = []
    for i, run in enumerate(runs):
        t = run["t"]
        ref_runs = [_curve(runs[j], np.ones_like) for j in refs_of[i]]
        bands = references = None
        if ref_runs:
            references = ReferenceCurves.from_curves(ref_runs, extrapolation="hold")
            bands = ReferenceBands.of(predictor, ref_runs, references)
        order = [run["corpus"] != "stdlib", run["corpus"], run["controls"].n_params, run["controls"].tokens_per_param]
        row: dict[str, Any] = {"cell": cell_of(run, calibrated_tpp), "order": order, "bank": run["bank"], "id": run["id"],
                               "references": len(ref_runs), "alarms": {}, "drifts": {}}
        for label, factor in [("clean", np.ones_like)] + [(f"{a:g}", drift(a / 100)) for a in DRIFTS]:
            curve = _curve(run, factor)
            found: dict[str, Any] = {}
            res = monitor_curve(t, curve.loss, predictor, run["controls"], band=band)
            found[MONITOR] = res.first_alarm
            if run["corpus"] in loco:
                found[LOCO] = monitor_curve(t, curve.loss, predictor, run["controls"], band=loco[run["corpus"]]).first_alarm
            if references is not None:
                _, ref_res, ref_row = monitor_runs([curve], predictor, references, bands)[0]
                found["reference mode"] = ref_row["first_alarm_train_fraction"]
                if label == "clean":
                    row["reference band"] = ref_row["band"]
                    row["ref_r08"] = None if ref_res is None else _at(ref_res.t_hat, ref_res.residual, 0.8)
                    row["ref_d08"] = None if ref_res is None else _at(ref_res.t_hat, ref_res.change, 0.8)
            y = run["raw"] * factor(t)
            found.update({n: f(t, y) for n, f in PEERS.items()})
            found[TREND] = trend(t, curve.loss)
            if label == "clean":
                row["alarms"] = found
                row["r08"] = _at(res.t_hat, res.residual, 0.8) if res.status != "aligning" else None
                row["d08"] = _at(res.t_hat, res.change, 0.8) if res.status != "aligning" else None
            else:
                row["drifts"][label] = found
        out.append(row)
    return {"runs": out, "loco_bands": {c: f"{b.source} (h {b.rule.threshold:.3g})" for c, b in loco.items()}}


def _caught(when: Optional[float], clean: Optional[float]) -> bool:
    """An alarm on the drifted copy in t̂ [0.5, 0.8] that its clean copy had not raised by then
    (a clean run's own false alarm in that stretch is not a catch)."""
    return (when is not None and DRIFT_START <= when <= CAUGHT_BY + 1e-9
            and (clean is None or clean > when + 1e-9))


def smallest_caught(rows: list[dict[str, Any]], name: str) -> tuple[Optional[float], dict[str, float]]:
    """(smallest drift caught in >= 90% of ``rows`` by t̂ 0.8, share caught per drift)."""
    share = {}
    for a in DRIFTS:
        hits = [_caught(r["drifts"][f"{a:g}"].get(name), r["alarms"].get(name)) for r in rows]
        share[f"{a:g}"] = float(np.mean(hits))
    caught = [a for a in DRIFTS if share[f"{a:g}"] >= 0.9]
    return (caught[0] if caught else None), share


def _sd(values: list[Optional[float]]) -> Optional[float]:
    v = np.asarray([x for x in values if x is not None], float)
    return float(v.std(ddof=1)) if v.size >= 2 else None


# --- Report -------------------------------------------------------------------------------------

def _pct(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def _drift_cell(a: Optional[float]) -> str:
    return f"> {DRIFTS[-1]:g}%" if a is None else f"{a:g}%"


def tables(results: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    rows = results["runs"]
    order = {r["cell"]: tuple(r["order"]) for r in rows}
    cells = sorted(order, key=lambda c: (order[c], c))
    summary: dict[str, Any] = {}
    lines = ["## Predictor mode: false alarms, clean spread and the smallest drift caught", "",
             f"Drift: + x% of the loss by the end, rising linearly from t̂ {DRIFT_START}; caught: an alarm in "
             f"t̂ [{DRIFT_START}, {CAUGHT_BY}], in ≥ 90% of the cell's runs. σ_r, σ_d: standard deviation over the "
             "cell's clean runs of the residual r and of its change d after the window, at t̂ 0.8. "
             "\"× σ_d\": the smallest drift's size at t̂ 0.8 (0.6 x) over σ_d (target ≤ 3). Peer columns: their "
             "false alarms / smallest drift caught. \"(calibration runs)\": runs the shipped predictor was fitted on; "
             "its reference curves contain them, so in predictor mode those cells are in-sample (a run alone at its "
             "controls is judged against itself: σ_d ~0); the other cells are held out.", "",
             "| cell | runs | false alarms | σ_r(0.8) | σ_d(0.8) | smallest drift | × σ_d | LOCO band: false alarms "
             "| smallest | × σ_d | " + " | ".join(n for n in NAMES[1:]) + " |", "|---|" + "---|" * (9 + len(NAMES) - 1)]
    for cell in cells:
        rs = [r for r in rows if r["cell"] == cell]
        fa = sum(r["alarms"][MONITOR] is not None for r in rs)
        sr, sd = _sd([r["r08"] for r in rs]), _sd([r["d08"] for r in rs])
        a, share = smallest_caught(rs, MONITOR)
        ratio = None if a is None or not sd else 0.6 * a / 100 / sd
        la, lshare = smallest_caught(rs, LOCO)
        lratio = None if la is None or not sd else 0.6 * la / 100 / sd
        lfa = sum(r["alarms"].get(LOCO) is not None for r in rs)
        summary[f"loco: {cell}"] = {"runs": len(rs), "false_alarms": lfa, "sigma_d": sd, "smallest": la,
                                    "ratio": lratio, "share": lshare}
        peers = []
        for n in NAMES[1:]:
            pa, _ = smallest_caught(rs, n)
            peers.append(f"{sum(r['alarms'][n] is not None for r in rs)} / {_drift_cell(pa)}")
        summary[cell] = {"runs": len(rs), "false_alarms": fa, "sigma_r": sr, "sigma_d": sd, "smallest": a,
                         "ratio": ratio, "share": share}
        lines.append(f"| {cell} | {len(rs)} | {fa}/{len(rs)} | {_pct(sr)} | {_pct(sd)} | {_drift_cell(a)} | "
                     f"{'–' if ratio is None else f'{ratio:.1f}'} | {lfa}/{len(rs)} | {_drift_cell(la)} | "
                     f"{'–' if lratio is None else f'{lratio:.1f}'} | " + " | ".join(peers) + " |")
    lines += ["", "## Reference mode: each run against the runs of its controls and another seed", "",
              "As `hpo monitor --reference` judges it: with the spread of the reference runs where ≥ 2 share the run's "
              "controls (\"measured\": the stored band's shape scaled to their spread, its h raised for the degrees "
              "of freedom that spread has, `predictors.monitor.scaled_band`), else the stored reference-mode band. "
              "σ_d: of d against the reference.", "",
              "| cell | runs | band | false alarms | σ_d(0.8) | smallest drift | × σ_d |", "|---|---|---|---|---|---|---|"]
    for cell in cells:
        rs = [r for r in rows if r["cell"] == cell and r["references"] > 0]
        if not rs:
            continue
        measured = sum("spread of the reference runs" in r.get("reference band", "") for r in rs)
        fa = sum(r["alarms"]["reference mode"] is not None for r in rs)
        sd = _sd([r.get("ref_d08") for r in rs])
        a, share = smallest_caught(rs, "reference mode")
        ratio = None if a is None or not sd else 0.6 * a / 100 / sd
        summary[f"reference: {cell}"] = {"runs": len(rs), "false_alarms": fa, "sigma_d": sd, "smallest": a,
                                         "ratio": ratio, "share": share}
        kind = "measured" if measured == len(rs) else "stored" if measured == 0 else f"measured {measured}, stored {len(rs) - measured}"
        lines.append(f"| {cell} | {len(rs)} | {kind} | {fa}/{len(rs)} | {_pct(sd)} | {_drift_cell(a)} | "
                     f"{'–' if ratio is None else f'{ratio:.1f}'} |")
    return lines, summary


def real_faults(predictor: Predictor) -> list[str]:
    """The real trainer faults of benchmarks/monitor_faults.csv (made by monitor_faults.py):
    when each detector alarms on the faulty run and on its clean twin, and when the faulty
    run's smoothed loss first exceeds its twin's by 1%."""
    from hpo.calibration.curve_import import load_curves_file
    from hpo.monitor.command import monitor_runs

    if not FAULTS_CSV.exists():
        return ["", "Real faults: benchmarks/monitor_faults.csv absent (run benchmarks/monitor_faults.py)."]
    frame = pd.read_csv(FAULTS_CSV)
    verdicts = {row["run_id"]: row for _, _, row in monitor_runs(load_curves_file(FAULTS_CSV, complete_only=False).curves,
                                                                  predictor)}
    lines = ["", "## Real faults made with the trainer", "",
             "`nice -n 10 python benchmarks/monitor_faults.py` writes benchmarks/monitor_faults.csv: each fault resumed "
             "from its clean twin's checkpoint at t̂ = 0.4 (see that script); 0.1M parameters (TPP 20, τ 0.3) unless "
             "named _24k. First alarm t̂ on the faulty run / on its clean twin (– none); \"+1% t̂\": where the faulty "
             "run's smoothed loss first exceeds its twin's by 1%; Δ: faulty / twin − 1 (train: the smoothed loss the "
             "monitor sees; val: the last validation loss).", "",
             "| fault | N | " + " | ".join(NAMES) + " | +1% t̂ | monitor before +1% | largest Δ train (t̂) | final Δ train | final Δ val |",
             "|---|---|" + "---|" * (len(NAMES) + 5)]
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for name in [r for r in frame["run_id"].unique() if not r.endswith("_twin")]:
        cells = []
        for run_id in (name, f"{name}_twin"):
            rows = frame[frame["run_id"] == run_id].sort_values("train_fraction")
            t, y, s = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "loss"))
            cells.append({MONITOR: verdicts[run_id]["first_alarm_train_fraction"],
                          **{n: f(t, y) for n, f in PEERS.items()}, TREND: trend(t, s)})
        bad, twin = (frame[frame["run_id"] == r].sort_values("train_fraction") for r in (name, f"{name}_twin"))
        ratio = bad["loss"].to_numpy(float) / twin["loss"].to_numpy(float) - 1
        above = np.flatnonzero(ratio > 0.01)
        rise = None if above.size == 0 else float(bad["train_fraction"].iloc[above[0]])
        alarm = cells[0][MONITOR]
        before = ("no fault above +1%" if rise is None else "yes" if alarm is not None and alarm < rise else "no")
        val = bad["val_loss"].dropna().iloc[-1] / twin["val_loss"].dropna().iloc[-1] - 1
        n = float(bad["n_params"].iloc[0])
        lines.append(f"| {name} | {n / 1e6:.2g}M | " + " | ".join(f"{fmt(cells[0][k])} / {fmt(cells[1][k])}" for k in NAMES)
                     + f" | {fmt(rise)} | {before} | {100 * ratio.max():+.1f}% ({bad['train_fraction'].iloc[ratio.argmax()]:.2f})"
                     f" | {100 * ratio[-1]:+.2f}% | {100 * val:+.2f}% |")
    return lines


def figure(summary: dict[str, Any], path: Path) -> None:
    """Share of runs caught by t̂ 0.8 against the drift in units of σ_d, one line per cell of
    ≥ 5 runs (held-out cells only in predictor mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("", "predictor mode, shipped band"), ("loco: ", "predictor mode, leave-one-corpus-out band"),
              ("reference: ", "reference mode"))
    fig, axes = plt.subplots(1, 3, figsize=(18, 5), dpi=100, sharey=True)
    for ax, (prefix, title) in zip(axes, panels):
        cells = [c for c in sorted(summary) if (c.split(": ")[0] + ": " if ": " in c else "") == prefix]
        k = 0
        for cell in cells:
            s = summary[cell]
            # The predictor's reference curves hold the calibration runs themselves: in predictor
            # mode those cells are in-sample (σ_d ~0 where a run is alone at its controls).
            if not s.get("sigma_d") or s["runs"] < 5 or (prefix != "reference: " and "calibration runs" in cell):
                continue
            x = [0.6 * a / 100 / s["sigma_d"] for a in DRIFTS]
            ax.plot(x, [100 * s["share"][f"{a:g}"] for a in DRIFTS], marker="o", ms=3, color=f"C{k % 10}",
                    label=f"{cell.removeprefix(prefix)} ({s['runs']})")
            k += 1
        ax.axhline(90, color="0.5", ls=":")
        ax.axvline(3, color="tab:red", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("drift at t̂ 0.8 / σ_d(0.8) of the cell")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"caught by t̂ {CAUGHT_BY} (% of runs)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="JSON of the measurements: read it if it exists (redraw), else write it")
    parser.add_argument("--max-runs", type=int, default=None,
                        help="at most this many runs per bank and model size (a smaller, faster benchmark)")
    args = parser.parse_args()
    if args.max_runs is not None and args.max_runs < 1:
        parser.error(f"--max-runs: must be >= 1, got {args.max_runs}")
    started = time.time()
    warnings.simplefilter("ignore")
    predictor = Predictor.load(default_predictor_path())
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        results = json.loads(cache.read_text())
    else:
        results = measure(predictor, load_runs(args.max_runs))
        results["seconds"] = time.time() - started
        results["max_runs"] = args.max_runs
        if cache is not None:
            cache.write_text(json.dumps(results))
    body, summary = tables(results)
    figure(summary, OUT.with_suffix(".png"))
    band = predictor.monitor_band
    ref = band.for_reference
    size = "every completed banked run" if results.get("max_runs") is None else \
        f"at most {results['max_runs']} runs per bank and model size"
    lines = ["# Collapse-residual monitor benchmark", "",
             f"`nice -n 10 python benchmarks/monitor.py{'' if results.get('max_runs') is None else ' --max-runs ' + str(results['max_runs'])}` "
             f"({results['seconds']:.0f} s; {size}: {len(results['runs'])} runs). Detector: {band.rule.describe()}. "
             f"Predictor-mode band: {band.source} ({band.n_curves} runs). Reference-mode band: "
             f"{ref.source} ({ref.n_curves} ordered pairs, h {ref.rule.threshold:.3g}). Leave-one-corpus-out (LOCO) "
             "bands, each measured against the shipped predictor on the clean runs of the other corpora: "
             + "; ".join(f"{c}: {words}" for c, words in results.get("loco_bands", {}).items()) + ".", "",
             "![share of runs caught against the drift in units of the clean spread](monitor.png)", "",
             *body, *real_faults(predictor), *kept_section(OUT)]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


#: The heading of the 124M section, which ``benchmarks/monitor_public.py`` writes into the same file.
PUBLIC_HEADING = "## At real scale: public 124M runs"


def kept_section(path: Path) -> list[str]:
    """The section as ``path`` holds it (this benchmark keeps it when it rewrites the file)."""
    if not path.exists():
        return []
    _, found, after = path.read_text().partition(PUBLIC_HEADING)
    if not found:
        return []
    nxt = after.find("\n## ")
    return ["", *(PUBLIC_HEADING + (after if nxt < 0 else after[:nxt])).rstrip("\n").split("\n")]


if __name__ == "__main__":
    main()
