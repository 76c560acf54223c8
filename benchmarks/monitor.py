"""Collapse-residual monitor benchmark (issue 26) -> benchmarks/monitor.md + monitor.png.

    python benchmarks/monitor.py

Every completed curve of every shipped bank (configs/calibration/*_bank.parquet): false alarms
of the monitor (shipped predictor, its band) and of re-implementations (ours) of the peer rules;
then the same curves with injected faults (multiplied into the logged interval losses, the
smoothed loss recomputed with the run's own trailing window): drifts of +2% and +5% by the end
starting at t̂ 0.3/0.45/0.6, a +3% step at 0.5, and a +20% spike at 0.5 that recovers over 0.02.
Detection delay = t̂ of the alarm − fault start; a missed fault counts as not detected.
Peer rules see the interval losses (train_loss), the monitor the smoothed loss. Real trainer
faults: not done here (see README).
"""

from __future__ import annotations

import glob
import time
import warnings
from pathlib import Path

import numpy as np

from hpo.curve_bank import load_bank, smoothing_window_of
from hpo.data import default_predictor_path
from predictors import Controls, Predictor
from predictors.monitor import monitor_curve
from predictors.smoothing import trailing_mean

OUT = Path(__file__).with_suffix(".md")


def _first(flags: np.ndarray, t: np.ndarray, start: int = 0) -> float | None:
    idx = np.flatnonzero(flags[start:])
    return None if idx.size == 0 else float(t[start + idx[0]])


def megatron(t, y):  # loss above 10x the largest seen
    return _first(y > 10 * np.maximum.accumulate(np.r_[y[0], y[:-1]]), t, 1)


def foundry(t, y, window=100, factor=2.0, patience=4):  # >= 2x running mean for more than 4 points
    flags = np.zeros(y.size, bool)
    run = 0
    for i in range(1, y.size):
        mean = y[max(0, i - window):i].mean()
        run = run + 1 if y[i] >= factor * mean else 0
        flags[i] = run > patience
    return _first(flags, t)


def lightning(t, y, window=10):  # |x - mean| >= 2 * mean over a window of 10
    flags = np.array([i >= window and abs(y[i] - y[i - window:i].mean()) >= 2 * y[i - window:i].mean()
                      for i in range(y.size)])
    return _first(flags, t)


def zscore(t, y, window=30, z=3.0):
    flags = np.zeros(y.size, bool)
    for i in range(window, y.size):
        w = y[i - window:i]
        flags[i] = w.std() > 0 and (y[i] - w.mean()) / w.std() > z
    return _first(flags, t)


def mad(t, y, window=21, z=6.0):
    flags = np.zeros(y.size, bool)
    for i in range(window, y.size):
        w = y[i - window:i]
        m = np.median(w)
        s = 1.4826 * np.median(np.abs(w - m))
        flags[i] = s > 0 and abs(y[i] - m) / s > z
    return _first(flags, t)


def trend(t, s, lookback=0.1, tol=0.01, span=0.05):
    """Smoothed loss above its own trend: a line fitted to log L over the previous 0.1 of t̂,
    extrapolated; alarm when L exceeds it by > 1% for 0.05 of t̂ (judged after t̂ 0.3)."""
    above_since = None
    for i in range(t.size):
        if t[i] < 0.3:
            continue
        w = (t >= t[i] - lookback - 0.02) & (t < t[i] - 0.02)
        if w.sum() < 3:
            continue
        a, b = np.polyfit(t[w], np.log(s[w]), 1)
        if s[i] > np.exp(a * t[i] + b) * (1 + tol):
            above_since = t[i] if above_since is None else above_since
            if t[i] - above_since >= span:
                return float(t[i])
        else:
            above_since = None
    return None


PEERS = {"Megatron 10x max": megatron, "Foundry KillLossSpike": foundry, "Lightning SpikeDetection": lightning,
         "z-score (30)": zscore, "median/MAD (21, 6)": mad}


def faults():
    for amount in (0.02, 0.05):
        for start in (0.3, 0.45, 0.6):
            yield f"drift +{100 * amount:g}% from {start}", start, (
                lambda t, a=amount, s=start: 1 + a * np.clip((t - s) / (1 - s), 0, 1))
    yield "step +3% at 0.5", 0.5, lambda t: 1 + 0.03 * (t >= 0.5)
    yield "spike +20% at 0.5, recovers in 0.02", 0.5, lambda t: 1 + 0.2 * np.clip(1 - (t - 0.5) / 0.02, 0, 1) * (t >= 0.5)


def main() -> None:
    started = time.time()
    warnings.simplefilter("ignore")
    predictor = Predictor.load(default_predictor_path())
    band = predictor.monitor_band
    prov = predictor.provenance
    runs = []
    for path in sorted(glob.glob("configs/calibration/*_bank.parquet")):
        frame = load_bank(path)
        for run_id, rows in frame.groupby("run_id"):
            first = rows.iloc[0]
            if first["status"] != "completed":
                continue
            rows = rows.sort_values("train_fraction")
            keep = (rows["train_fraction"] > 0) & np.isfinite(rows["train_loss"])
            rows = rows[keep]
            in_range = (float(first["n_params"]) in [float(x) for x in prov.get("model_sizes", [])]
                        and float(first["tokens_per_param"]) in [float(x) for x in prov.get("tokens_per_param", [])]
                        and first["schedule"] == "linear")
            runs.append((Path(path).stem.replace("_bank", ""), rows, Controls.from_mapping(first.to_dict()), in_range,
                         smoothing_window_of(first.to_dict())))
    names = ["collapse monitor", *PEERS, "smoothed loss above own trend"]
    clean_alarms = {n: [0, 0] for n in names}  # [in range, others]
    detect = {}
    for bank, rows, controls, in_range, window in runs:
        t = rows["train_fraction"].to_numpy(float)
        raw = rows["train_loss"].to_numpy(float)
        tokens = rows["tokens"].to_numpy(float)
        controls = Controls(controls.tau, controls.tokens_per_param, controls.schedule, float(rows["n_params"].iloc[0]))
        cases = [("clean", None, lambda x: np.ones_like(x))] + list(faults())
        for label, start, factor in cases:
            y = raw * factor(t)
            s = trailing_mean(tokens, y, window)
            res = {"collapse monitor": monitor_curve(t, s, predictor, controls, band=band).first_alarm,
                   **{n: f(t, y) for n, f in PEERS.items()}, "smoothed loss above own trend": trend(t, s)}
            for n, when in res.items():
                if label == "clean":
                    clean_alarms[n][0 if in_range else 1] += when is not None
                else:
                    detect.setdefault((label, n), []).append(None if when is None or when < start else when - start)
    n_in = sum(r[3] for r in runs)
    lines = ["# Collapse-residual monitor benchmark (issue 26)", "",
             f"`python benchmarks/monitor.py` ({time.time() - started:.0f} s). {len(runs)} completed banked curves "
             f"({n_in} in the shipped predictor's calibrated range: N and TPP it was calibrated at, linear schedule). "
             f"Monitor: shipped predictor, band of {band.n_curves} runs, rule |r − c| > {band.rule.z:g}σ for "
             f"≥ {band.rule.span:g} of t̂, alignment window 0.15–0.30.", "",
             "## False alarms on clean curves", "", "| detector | in range | others |", "|---|---|---|"]
    for n in names:
        a, b = clean_alarms[n]
        lines.append(f"| {n} | {a}/{n_in} | {b}/{len(runs) - n_in} |")
    lines += ["", "## Injected faults: detected (share of runs) and mean delay in t̂ after the fault starts", "",
              "| fault | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, _, _ in faults():
        cells = []
        for n in names:
            d = detect[(label, n)]
            hit = [x for x in d if x is not None]
            cells.append(f"{100 * len(hit) / len(d):.0f}%" + (f", {np.mean(hit):.2f}" if hit else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "A fault caught before it starts (an alarm at t̂ < start) counts as not detected.",
              "Real faults made with the trainer: not done (CPU time; see README)."]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
