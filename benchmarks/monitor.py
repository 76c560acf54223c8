"""Collapse-residual monitor benchmark (issue 26) -> benchmarks/monitor.md + monitor.png.

    python benchmarks/monitor.py

Every completed curve of every shipped bank (configs/calibration/*_bank.parquet): false alarms
of the monitor (shipped predictor, its band) and of re-implementations (ours) of the peer rules;
then the same curves with injected faults (multiplied into the logged interval losses, the
smoothed loss recomputed with the run's own trailing window): drifts of +2% and +5% by the end
starting at t̂ 0.3/0.45/0.6, a +3% step at 0.5, and a +20% spike at 0.5 that recovers over 0.02.
Detection delay = t̂ of the alarm − fault start; a missed fault counts as not detected.
Peer rules see the interval losses (train_loss), the monitor the smoothed loss. Real trainer
faults: the curves benchmarks/monitor_faults.py banked in benchmarks/monitor_faults.csv.
``--cache FILE`` keeps the alarm times, so the figure and tables can be redrawn in seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from hpo.trials.curve_bank import load_bank, smoothing_window_of
from hpo.data import default_predictor_path
from predictors import Controls, Predictor
from predictors.monitor import DetectorRule, _first_alarm, monitor_curve
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


NAMES = ["collapse monitor", *PEERS, "smoothed loss above own trend"]


def load_runs(prov: dict) -> list:
    """(bank, rows, controls, in calibrated range, smoothing window) of every completed banked curve."""
    runs = []
    for path in sorted(glob.glob("configs/calibration/*_bank.parquet")):
        frame = load_bank(path)
        for run_id, rows in frame.groupby("run_id"):
            first = rows.iloc[0]
            if first["status"] != "completed":
                continue
            rows = rows.sort_values("train_fraction")
            rows = rows[(rows["train_fraction"] > 0) & np.isfinite(rows["train_loss"])]
            in_range = (float(first["n_params"]) in [float(x) for x in prov.get("model_sizes", [])]
                        and float(first["tokens_per_param"]) in [float(x) for x in prov.get("tokens_per_param", [])]
                        and first["schedule"] == "linear")
            controls = Controls.from_mapping(first.to_dict())
            controls = Controls(controls.tau, controls.tokens_per_param, controls.schedule, float(first["n_params"]))
            runs.append((Path(path).stem.replace("_bank", ""), rows, controls, in_range,
                         smoothing_window_of(first.to_dict())))
    return runs


def detections(t, raw, tokens, window, controls, predictor, factor, upward: bool = False) -> dict:
    """First alarm t̂ (or None) of every detector on one run with ``factor`` multiplied in.
    ``upward``: the monitor's alarm counts only above its band (the side a fault that raises the
    loss moves it; an alarm below is the run's own deviation, not the fault found)."""
    y = raw * factor(t)
    s = trailing_mean(tokens, y, window)
    verdict = monitor_curve(t, s, predictor, controls, band=predictor.monitor_band)
    found = verdict.first_alarm if not upward or verdict.direction == "above" else None
    return {"collapse monitor": found,
            **{n: f(t, y) for n, f in PEERS.items()}, "smoothed loss above own trend": trend(t, s)}


def collect(predictor: Predictor, runs: list) -> dict:
    """{"clean": {detector: [alarm t̂ per run]}, fault label: {...}, "in_range": [bool per run]}."""
    out: dict = {"in_range": [bool(r[3]) for r in runs]}
    cases = [("clean", None, lambda x: np.ones_like(x))] + list(faults())
    for bank, rows, controls, in_range, window in runs:
        t = rows["train_fraction"].to_numpy(float)
        raw = rows["train_loss"].to_numpy(float)
        tokens = rows["tokens"].to_numpy(float)
        for label, _, factor in cases:
            for n, when in detections(t, raw, tokens, window, controls, predictor, factor, label != "clean").items():
                out.setdefault(label, {}).setdefault(n, []).append(when)
    return out


def summary(results: dict) -> dict:
    """Per fault and detector: (share detected after the start, mean delay of those)."""
    table = {}
    for label, start, _ in faults():
        for n in NAMES:
            d = [None if w is None or w < start else w - start for w in results[label][n]]
            hit = [x for x in d if x is not None]
            table[(label, n)] = (len(hit) / len(d), float(np.mean(hit)) if hit else None)
    return table


def markdown(results: dict, band, seconds: float, extra: list[str]) -> str:
    in_range = np.asarray(results["in_range"])
    n_in, n_all = int(in_range.sum()), in_range.size
    lines = ["# Collapse-residual monitor benchmark (issue 26)", "",
             f"`python benchmarks/monitor.py` ({seconds:.0f} s). {n_all} completed banked curves "
             f"({n_in} in the shipped predictor's calibrated range: N and TPP it was calibrated at, linear schedule). "
             f"Monitor: shipped predictor, band of {band.n_curves} runs, rule |r − c| > {band.rule.z:g}σ for "
             f"≥ {band.rule.span:g} of t̂, alignment window 0.15–0.30.", "",
             "![detection rate and delay per fault, and an example residual](monitor.png)", "",
             "## False alarms on clean curves", "", "| detector | in range | others |", "|---|---|---|"]
    for n in NAMES:
        alarmed = np.asarray([w is not None for w in results["clean"][n]])
        lines.append(f"| {n} | {int((alarmed & in_range).sum())}/{n_in} | {int((alarmed & ~in_range).sum())}/{n_all - n_in} |")
    lines += ["", "## Injected faults: detected (share of runs) and mean delay in t̂ after the fault starts", "",
              "| fault | " + " | ".join(NAMES) + " |", "|---|" + "---|" * len(NAMES)]
    table = summary(results)
    for label, _, _ in faults():
        cells = []
        for n in NAMES:
            share, delay = table[(label, n)]
            cells.append(f"{100 * share:.0f}%" + (f", {delay:.2f}" if delay is not None else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "A fault caught before it starts (an alarm at t̂ < start) counts as not detected; so does a monitor alarm "
              "below its band (every fault raises the loss; the peer rules but median/MAD look upward only). "
              "Megatron, Foundry and "
              "Lightning detect none of these faults (no bars in the figure).", *extra]
    return "\n".join(lines) + "\n"


def false_alarm_notes(results: dict, runs: list) -> list[str]:
    """Which in-range clean runs the monitor alarms on: bank, peak LR, the largest one-interval
    rise of the interval loss (a loss spike) and the alarm."""
    lines = []
    for (bank, rows, controls, in_range, window), when in zip(runs, results["clean"]["collapse monitor"]):
        if in_range and when is not None:
            y = rows["train_loss"].to_numpy(float)
            jump = y[1:] / y[:-1]
            at = float(rows["train_fraction"].iloc[1 + int(np.argmax(jump))])
            lines.append(f"{bank} run {rows['run_id'].iloc[0]} (η {float(rows['eta'].iloc[0]):g}): alarm at t̂ "
                         f"{when:.2f}, its interval loss rises {100 * (jump.max() - 1):.0f}% in one interval at t̂ {at:.2f}")
    if not lines:
        return []
    etas = sorted({float(r[1]["eta"].iloc[0]) for r in runs if r[3]})
    return ["", f"In-range clean runs the monitor alarms on (in-range peak LRs: {', '.join(f'{e:g}' for e in etas)}):", "",
            *[f"- {line}" for line in lines]]


def figure(results: dict, predictor: Predictor, runs: list, path: Path) -> None:
    """Left: detection rate per fault and detector; middle: mean delay; right: one example residual."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summary(results)
    labels = [label for label, _, _ in faults()]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2), dpi=100, gridspec_kw={"width_ratios": [1.2, 1.2, 1.0]})
    y = np.arange(len(labels))
    h = 0.8 / len(NAMES)
    for k, n in enumerate(NAMES):
        share = [100 * table[(lb, n)][0] for lb in labels]
        delay = [table[(lb, n)][1] if table[(lb, n)][1] is not None else np.nan for lb in labels]
        style = {"color": "k"} if n == "collapse monitor" else {"color": f"C{k}"}
        axes[0].barh(y + (k - len(NAMES) / 2) * h, share, h, label=n, **style)
        axes[1].barh(y + (k - len(NAMES) / 2) * h, delay, h, **style)
    for ax, title in ((axes[0], "detected (% of runs)"), (axes[1], "mean delay after the fault starts (t̂)")):
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[1].set_yticklabels([])
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(NAMES), fontsize=8, frameon=False)
    _example(axes[2], predictor, runs)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _example(ax, predictor: Predictor, runs: list) -> None:
    """The first in-range run whose +5% drift from 0.45 the monitor catches: clean and drifted r."""
    band = predictor.monitor_band
    drift = next(f for label, _, f in faults() if label == "drift +5% from 0.45")
    for bank, rows, controls, in_range, window in runs:
        if not in_range:
            continue
        t, raw, tokens = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "tokens"))
        bad = monitor_curve(t, trailing_mean(tokens, raw * drift(t), window), predictor, controls, band=band)
        if bad.alarm and bad.first_alarm >= 0.45 and bad.direction == "above":
            clean = monitor_curve(t, trailing_mean(tokens, raw, window), predictor, controls, band=band)
            break
    else:
        return
    grid = np.linspace(bad.window[1], 1.0, 100)
    c, s = band.at(grid)
    z = band.rule.z
    ax.fill_between(100 * grid, 100 * (c - z * s), 100 * (c + z * s), color="0.85", label=f"band c ± {z:g}σ")
    ax.axvspan(100 * bad.window[0], 100 * bad.window[1], color="tab:blue", alpha=0.1, label="alignment window")
    ax.plot(100 * clean.t_hat, 100 * clean.residual, color="tab:green", lw=1, label="clean run")
    ax.plot(100 * bad.t_hat, 100 * bad.residual, color="k", lw=1.2, label="same run, +5% drift from t̂ 0.45")
    ax.axvline(45, color="0.4", ls=":", lw=1)
    ax.axvline(100 * bad.first_alarm, color="tab:red", lw=1.5, label=f"alarm t̂ = {bad.first_alarm:.2f}")
    seen = bad.residual[bad.t_hat >= bad.window[0]]
    ax.set_ylim(100 * (min(seen.min(), (c - z * s).min()) - 0.01), 100 * (max(seen.max(), (c + z * s).max()) + 0.01))
    ax.set_xlim(0, 100)
    ax.set_xlabel("training fraction t̂ (%)")
    ax.set_ylabel("residual r (%)")
    ax.set_title(f"example: {bank} run, N = {controls.n_params / 1e6:.2g}M, TPP {controls.tokens_per_param:g}",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")


def _cusum(k: float, h: float):
    """A two-sided CUSUM on z = (r − c)/σ over the judged points: S⁺ = max(0, S⁺ + z − k),
    S⁻ = max(0, S⁻ − z − k); alarm when either exceeds h (a restart grace resets both)."""
    def rule(t: np.ndarray, z: np.ndarray, judged: np.ndarray) -> tuple[float | None, str | None]:
        up = down = 0.0
        for i in range(t.size):
            if not judged[i]:
                up = down = 0.0
                continue
            up, down = max(0.0, up + z[i] - k), max(0.0, down - z[i] - k)
            if up > h or down > h:
                return float(t[i]), "above" if up > h else "below"
        return None, None
    return rule


def _sustained(z: float, span: float):
    rule = DetectorRule(z=z, span=span)
    return lambda t, zz, judged: _first_alarm(t, zz, judged, rule)[::2]  # (t̂, side)


#: Other rules on the same residual and band (not shipped: see the section they fill in monitor.md).
RULES = {"beyond 4σ for 0.05 (shipped)": _sustained(4, 0.05), "beyond 3σ for 0.05": _sustained(3, 0.05),
         "beyond 3σ for 0.1": _sustained(3, 0.1), "beyond 5σ for 0.2": _sustained(5, 0.2),
         "CUSUM k 2, h 40": _cusum(2, 40), "CUSUM k 3, h 20": _cusum(3, 20), "CUSUM k 3, h 40": _cusum(3, 40)}


def rule_frontier(predictor: Predictor, runs: list) -> list[str]:
    """False alarms and detection of the RULES on the benchmark's curves and the real faults."""
    from hpo.calibration.curve_import import load_curves_file
    from hpo.monitor.command import monitor_runs

    band = predictor.monitor_band
    cases = [("clean", 0.0, lambda x: np.ones_like(x))] + [f for f in faults() if not f[0].startswith("spike")]
    hits = {name: {} for name in RULES}
    for bank, rows, controls, in_range, window in runs:
        t, raw, tokens = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "tokens"))
        for label, start, factor in cases:
            res = monitor_curve(t, trailing_mean(tokens, raw * factor(t), window), predictor, controls, band=band)
            key = ("clean in" if in_range else "clean out") if label == "clean" else label.split(" from")[0]
            for name, rule in RULES.items():
                when, side = rule(res.t_hat, res.z, res.judged)
                hit = when is not None if label == "clean" else (when is not None and when >= start and side == "above")
                hits[name].setdefault(key, []).append(hit)
    path = OUT.with_name("monitor_faults.csv")
    real = monitor_runs(load_curves_file(path, complete_only=False).curves, predictor) if path.exists() else []
    head = "| rule | false alarms in range | others | drift +2% | drift +5% | step +3% | real faults | their twins |"
    lines = ["", "## Other detector rules on the same residual and band (measured, not shipped)", "",
             "\"beyond zσ for s\": |r − c| > zσ on one side for ≥ s of t̂ (the shipped rule's form). "
             "Detected: share of the injected faults caught after they start (drifts: all three starts); "
             "real faults: alarmed after the resume at t̂ 0.4, of 2.", "", head, "|---|" + "---|" * 7]
    for name, rule in RULES.items():
        h = hits[name]
        fa_in, fa_out = sum(h["clean in"]), sum(h["clean out"])
        real_hit = [(lambda w, side: w if side == "above" else None)(*rule(r.t_hat, r.z, r.judged))
                    for c, r, _ in real if r is not None]
        ids = [row["run_id"] for _, r, row in real if r is not None]
        faulty = sum(w is not None and w >= 0.4 for w, i in zip(real_hit, ids) if not i.endswith("_twin"))
        twins = sum(rule(r.t_hat, r.z, r.judged)[0] is not None for _, r, row in real
                    if r is not None and row["run_id"].endswith("_twin"))
        share = lambda key: f"{100 * np.mean(h[key]):.0f}%"  # noqa: E731
        lines.append(f"| {name} | {fa_in}/{len(h['clean in'])} | {fa_out}/{len(h['clean out'])} | "
                     f"{share('drift +2%')} | {share('drift +5%')} | {share('step +3% at 0.5')} | {faulty}/2 | {twins}/2 |")
    return lines


def residual_spread(predictor: Predictor, runs: list) -> list[str]:
    """How much of the clean runs' residual spread a run's own early residual explains: σ of r
    at t̂ over the runs, and σ of what is left after regressing r(t̂) on the run's mean r over
    t̂ 0.30–0.40 (a band conditioned on it would be that narrow), and of r(t̂) − r(0.40)."""
    grid = np.round(np.arange(0.30, 1.0 + 1e-9, 0.025), 4)
    rows_by_range: dict[bool, list] = {True: [], False: []}
    for bank, rows, controls, in_range, window in runs:
        t, raw, tokens = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "tokens"))
        res = monitor_curve(t, trailing_mean(tokens, raw, window), predictor, controls, band=predictor.monitor_band)
        if res.status != "aligning" and res.t_hat[-1] >= 0.99:
            rows_by_range[bool(in_range)].append(np.interp(grid, res.t_hat, res.residual))
    lines = ["", "## Spread of the clean residual, and what a run's own early residual explains (measured)", "",
             "σ: standard deviation of r over the clean runs at t̂; conditioned: of what is left after a per-t̂ "
             "linear regression on the run's mean r over t̂ 0.30–0.40; change: of r(t̂) − r(0.40). For scale: a "
             "+2% drift from t̂ 0.3 adds 0.4% at t̂ 0.45, 0.9% at 0.6, 1.4% at 0.8 and 2% at 1.", "",
             "| runs | t̂ | σ | conditioned | change |", "|---|---|---|---|---|"]
    for label, mat in (("in range", rows_by_range[True]), ("all", rows_by_range[True] + rows_by_range[False])):
        m = np.asarray(mat)
        centred = m - m.mean(axis=0)
        early = m[:, (grid >= 0.30) & (grid <= 0.40)].mean(axis=1)
        early = early - early.mean()
        beta = centred.T @ early / (early @ early)
        left = centred - np.outer(early, beta)
        at4 = int(np.argmin(np.abs(grid - 0.40)))
        for x in (0.45, 0.6, 0.8, 1.0):
            j = int(np.argmin(np.abs(grid - x)))
            lines.append(f"| {label} ({len(m)}) | {x:g} | {100 * centred[:, j].std():.2f}% | "
                         f"{100 * left[:, j].std():.2f}% | {100 * (m[:, j] - m[:, at4]).std():.2f}% |")
    return lines


def conditional_band_trial(predictor: Predictor, runs: list) -> list[str]:
    """A band conditioned on the run's own mean r over t̂ 0.30–0.40 (judged after 0.40) against
    the plain band, both measured on one half of the in-range clean runs (split by a hash of the
    run id) and tested on the other half, the out-of-range runs and their injected faults; the
    residuals on a 0.0125 grid, the shipped rule's form (beyond zσ for 0.05)."""
    import zlib

    grid = np.round(np.arange(0.30, 1.0 + 1e-9, 0.0125), 4)
    cases = [("clean", 0.0, lambda x: np.ones_like(x))] + [f for f in faults() if not f[0].startswith("spike")]
    res: dict[str, list] = {label: [] for label, _, _ in cases}
    split = []
    for bank, rows, controls, in_range, window in runs:
        t, raw, tokens = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "tokens"))
        got = [monitor_curve(t, trailing_mean(tokens, raw * f(t), window), predictor, controls,
                             band=predictor.monitor_band) for _, _, f in cases]
        if any(g.status == "aligning" or g.t_hat[-1] < 0.99 for g in got):
            continue
        for (label, _, _), g in zip(cases, got):
            res[label].append(np.interp(grid, g.t_hat, g.residual))
        split.append(2 if not in_range else zlib.crc32(str(rows["run_id"].iloc[0]).encode()) % 2)
    r = {k: np.asarray(v) for k, v in res.items()}
    split = np.asarray(split)
    clean = r["clean"][split == 0]
    early = (grid >= 0.30) & (grid <= 0.40)
    c, s = clean.mean(axis=0), np.maximum(clean.std(axis=0), 0.002)
    e = clean[:, early].mean(axis=1) - clean[:, early].mean()
    beta = (clean - c).T @ e / (e @ e)
    s_cond = np.maximum(((clean - c) - np.outer(e, beta)).std(axis=0), 0.002)
    e0 = clean[:, early].mean()

    def plain(x: np.ndarray, rule: DetectorRule) -> tuple[float | None, str | None]:
        judged = grid > 0.30
        return _first_alarm(grid, np.where(judged, (x - c) / s, np.nan), judged, rule)[::2]

    def conditioned(x: np.ndarray, rule: DetectorRule) -> tuple[float | None, str | None]:
        judged = grid > 0.40
        z = (x - c - beta * (x[early].mean() - e0)) / s_cond
        return _first_alarm(grid, np.where(judged, z, np.nan), judged, rule)[::2]

    n_in, n_out = int((split == 1).sum()), int((split == 2).sum())
    lines = ["", "## A band conditioned on the run's early residual (measured, not shipped)", "",
             f"Both bands measured on {int((split == 0).sum())} in-range clean runs; tested on the other {n_in} "
             f"in-range runs and the {n_out} others (false alarms) and on the faults injected into them "
             "(detected after the start; drifts: all three starts).", "",
             "| band | z | false alarms in range | others | drift +2% | drift +5% | step +3% |", "|---|---|---|---|---|---|---|"]
    for z in (3.0, 4.0, 5.0):
        rule = DetectorRule(z=z, span=0.05)
        for name, fn in (("plain", plain), ("conditioned on r over t̂ 0.30–0.40", conditioned)):
            fa = [sum(fn(x, rule)[0] is not None for x in r["clean"][split == k]) for k in (1, 2)]
            hit: dict[str, list] = {}
            for label, start, _ in cases[1:]:
                hit.setdefault(label.split(" from")[0], []).extend(
                    (w is not None and w >= start and side == "above")
                    for w, side in (fn(x, rule) for x in r[label][split > 0]))
            cells = " | ".join(f"{100 * np.mean(v):.0f}%" for v in hit.values())
            lines.append(f"| {name} | {z:g} | {fa[0]}/{n_in} | {fa[1]}/{n_out} | {cells} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="JSON of the alarm times: read it if it exists (redraw), else write it")
    args = parser.parse_args()
    started = time.time()
    warnings.simplefilter("ignore")
    predictor = Predictor.load(default_predictor_path())
    runs = load_runs(predictor.provenance)
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        results = json.loads(cache.read_text())
    else:
        results = collect(predictor, runs)
        results["rules"] = rule_frontier(predictor, runs)
        results["spread"] = residual_spread(predictor, runs) + conditional_band_trial(predictor, runs)
        results["seconds"] = time.time() - started  # the full run's time, also when redrawn from the cache
        if cache is not None:
            cache.write_text(json.dumps(results))
    figure(results, predictor, runs, OUT.with_suffix(".png"))
    extra = false_alarm_notes(results, runs) + real_faults(predictor) + results.get("rules", []) + results.get("spread", [])
    text = markdown(results, predictor.monitor_band, results.get("seconds", time.time() - started), extra)
    OUT.write_text(text)
    print(text)


def real_faults(predictor: Predictor) -> list[str]:
    """The real trainer faults of benchmarks/monitor_faults.csv (made by monitor_faults.py):
    when each detector alarms on the faulty run and on its clean twin, and when the faulty
    run's smoothed loss first exceeds its twin's by 1%."""
    from hpo.calibration.curve_import import load_curves_file
    from hpo.monitor.command import monitor_runs

    path = OUT.with_name("monitor_faults.csv")
    if not path.exists():
        return ["Real faults made with the trainer: benchmarks/monitor_faults.csv absent (run monitor_faults.py)."]
    frame = pd.read_csv(path)
    verdicts = {row["run_id"]: row for _, _, row in monitor_runs(load_curves_file(path, complete_only=False).curves,
                                                                  predictor)}
    cols = ["collapse monitor", *PEERS, "smoothed loss above own trend"]
    lines = ["", "## Real faults made with the trainer", "",
             "`nice -n 5 python benchmarks/monitor_faults.py` writes benchmarks/monitor_faults.csv: the quickstart's "
             "0.1M model (TPP 20, τ 0.3), each fault resumed from its clean twin's checkpoint at t̂ = 0.4 "
             "(see that script). First alarm t̂ on the faulty run / on its clean twin (– none); "
             "\"+1% t̂\": where the faulty run's smoothed loss first exceeds its twin's by 1%; Δ: faulty / twin − 1 "
             "(train: the smoothed loss the monitor sees; val: the last validation loss).", "",
             "| fault | " + " | ".join(cols) + " | +1% t̂ | largest Δ train (t̂) | final Δ train | final Δ val |",
             "|---|" + "---|" * (len(cols) + 4)]
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for name in [r for r in frame["run_id"].unique() if not r.endswith("_twin")]:
        cells = []
        for run_id in (name, f"{name}_twin"):
            rows = frame[frame["run_id"] == run_id].sort_values("train_fraction")
            t, y, s = (rows[c].to_numpy(float) for c in ("train_fraction", "train_loss", "loss"))
            cells.append({"collapse monitor": verdicts[run_id]["first_alarm_train_fraction"],
                          **{n: f(t, y) for n, f in PEERS.items()}, "smoothed loss above own trend": trend(t, s)})
        bad, twin = (frame[frame["run_id"] == r].sort_values("train_fraction") for r in (name, f"{name}_twin"))
        ratio = bad["loss"].to_numpy(float) / twin["loss"].to_numpy(float) - 1
        above = np.flatnonzero(ratio > 0.01)
        rise = None if above.size == 0 else float(bad["train_fraction"].iloc[above[0]])
        val = bad["val_loss"].dropna().iloc[-1] / twin["val_loss"].dropna().iloc[-1] - 1
        lines.append(f"| {name} | " + " | ".join(f"{fmt(cells[0][n])} / {fmt(cells[1][n])}" for n in cols)
                     + f" | {fmt(rise)} | {100 * ratio.max():+.1f}% ({bad['train_fraction'].iloc[ratio.argmax()]:.2f})"
                     f" | {100 * ratio[-1]:+.2f}% | {100 * val:+.2f}% |")
    return lines


if __name__ == "__main__":
    main()
