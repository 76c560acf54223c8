"""The report's PNG plots (matplotlib, Agg canvas; pyplot and its global state are not used,
so drawing is safe in a headless process and inside Ray's driver). They draw what
:mod:`hpo.reporting.analysis` computed; :mod:`hpo.reporting.report` calls them.

* :func:`plot_curves`     raw smoothed loss vs t̂ for every trial, rungs as vertical lines;
* :func:`plot_normalized` each curve divided by its final loss (or latest predicted final),
  with ℓ̂ per distinct controls dashed;
* :func:`plot_regret`     regret vs stop fraction for predicted-best and current-best (audit
  mode, or every trial finished);
* :func:`plot_rung_predictions` what is known without audit: each trial's predicted final
  ±1σ at each rung, and whether it was kept or stopped there.

Up to :data:`LEGEND_MAX` trials each gets a colour and a legend entry (or a direct label). A
larger sweep would bury its curves under the legend, so its trials are coloured by the searched
value that varies most (a colour bar says which), and only the finished trials (a few, after
early stopping) are named: in the legend, or directly at the right edge (:func:`trial_palette`).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hpo.reporting.analysis import clean_history, controls_of, is_diverged
from hpo.decisions.scheduler_state import TrialRecord, TrialStatus
from predictors import equations
from predictors.io import atomic_write_with, finite_or_none

#: Most trials drawn with a legend entry each; more are coloured by a searched value (colour bar).
LEGEND_MAX = 12

RULE_STYLE = {
    "predicted_best": {"label": "predicted-best", "color": "tab:blue", "marker": "o"},
    "current_best": {"label": "current-best", "color": "tab:orange", "marker": "s"},
}


def _figure(width: float = 9.0, height: float = 5.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(max(n, 1))]


@dataclass
class Palette:
    """Trial colours: one per trial (``key`` None: a legend names them), or by the value of
    config ``key`` through ``mappable`` (many trials: a colour bar names them)."""

    colors: dict[str, Any]
    key: Optional[str] = None
    mappable: Any = None

    @property
    def by_value(self) -> bool:
        return self.key is not None


def trial_palette(configs: Mapping[str, Mapping[str, Any]]) -> Palette:
    """Colours for the trials ``{trial_id: config}`` (see the module docstring): up to
    :data:`LEGEND_MAX` trials a qualitative colour each; more, a colour map over the numeric
    config key whose values spread most (in log when all are positive), e.g. ``lr``."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, LogNorm, Normalize

    ids = list(configs)
    if len(ids) <= LEGEND_MAX:
        return Palette(dict(zip(ids, _colors(len(ids)))))
    best: Optional[tuple[float, str, dict[str, float]]] = None
    for key in sorted({k for c in configs.values() for k in (c or {})}):
        values = {tid: finite_or_none((configs[tid] or {}).get(key)) for tid in ids}
        if any(v is None for v in values.values()):
            continue
        vals = np.array(list(values.values()), dtype=float)
        if np.ptp(vals) == 0:
            continue
        spread = (float(np.log(vals.max() / vals.min())) if np.all(vals > 0)
                  else float(np.ptp(vals) / max(np.abs(vals).max(), 1e-300)))
        if best is None or spread > best[0]:
            best = (spread, key, values)  # type: ignore[assignment]
    # Viridis without its last 10%: the bright yellow end is hard to read on white.
    cmap = ListedColormap(colormaps["viridis"](np.linspace(0.0, 0.9, 256)))
    if best is None:  # nothing numeric varies: colour by order, no colour bar
        return Palette({tid: cmap(i / max(len(ids) - 1, 1)) for i, tid in enumerate(ids)})
    _, key, values = best
    vals = np.array(list(values.values()), dtype=float)
    norm = (LogNorm(vals.min(), vals.max()) if np.all(vals > 0) and vals.max() / vals.min() >= 3
            else Normalize(vals.min(), vals.max()))
    return Palette({tid: cmap(float(norm(v))) for tid, v in values.items()}, key,
                   ScalarMappable(norm=norm, cmap=cmap))


def _color_bar(fig: Figure, ax: Any, palette: Palette) -> None:
    if palette.by_value:
        bar = fig.colorbar(palette.mappable, ax=ax, pad=0.01, fraction=0.04)
        bar.set_label(f"{palette.key} (trial colour)", fontsize=8)
        bar.ax.tick_params(labelsize=7)


def _spread(ys: Sequence[float], min_gap: float) -> list[float]:
    """``ys`` moved apart (in their order) so that neighbours are at least ``min_gap`` apart:
    direct labels that would overlap are stacked instead."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = list(ys)
    for prev, cur in zip(order, order[1:]):
        out[cur] = max(out[cur], out[prev] + min_gap)
    return out


def _legend(ax: Any, n: int) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if not handles:
        return
    # Inside the axes always (a legend beside them took ~40% of the width); many entries go in
    # two or three columns of small type.
    ax.legend(fontsize=7 if n <= 12 else 6, loc="upper right", ncol=1 if n <= 12 else (2 if n <= 24 else 3),
              framealpha=0.85)


def _robust_ylim(ax: Any, values: list[np.ndarray], low_pad: float = 0.02, q: float = 0.98) -> None:
    """Clip the y-range to the bulk of the data (early-training and pre-divergence spikes)."""
    data = np.concatenate([v[np.isfinite(v)] for v in values if len(v)]) if values else np.array([])
    if data.size < 2:
        return
    lo, hi = float(np.min(data)), float(np.quantile(data, q))
    if hi > lo:
        pad = (hi - lo) * 0.05
        ax.set_ylim(lo - max(pad, low_pad * abs(lo) * 0.1), hi + pad)


def _save(fig: Figure, path: Path) -> Path:
    return atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png"))


def _message(ax: Any, text: str) -> None:
    text = "\n".join(textwrap.fill(line, 70) for line in text.splitlines())
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_curves(trials: Sequence[TrialRecord], labels: dict[str, str], rungs: Sequence[float],
                path: Path) -> Path:
    """Smoothed loss vs t̂ per trial; stopped trials end at their rung (×), diverged ones are
    dotted and end in a red ×; rungs are vertical lines."""
    fig, ax = _figure()
    palette = trial_palette({rec.trial_id: rec.config for rec in trials})
    ys: list[np.ndarray] = []
    drawn = finished = 0
    for rec in trials:
        t, y = clean_history(rec.history)
        if len(t) == 0:
            continue
        color = palette.colors[rec.trial_id]
        diverged = is_diverged(rec)
        label = f"{rec.trial_id}: {labels.get(rec.trial_id, '')}".rstrip(": ")
        if diverged:
            label += " (diverged)"
        elif rec.status == TrialStatus.STOPPED and rec.stopped_at is not None:
            label += f" (stopped at {rec.stopped_at:g})"
        named = not palette.by_value or (rec.status == TrialStatus.COMPLETED and finished < LEGEND_MAX)
        finished += rec.status == TrialStatus.COMPLETED
        ax.plot(t, y, color=color, lw=1.0 if palette.by_value else 1.3, ls=":" if diverged else "-",
                label=label if named else None)
        if diverged or rec.status == TrialStatus.STOPPED:
            ax.plot(t[-1], y[-1], marker="x", color="red" if diverged else color, ms=7 if not palette.by_value else 5,
                    mew=2 if not palette.by_value else 1.2)
        ys.append(y[t >= 0.02] if np.any(t >= 0.02) else y)
        drawn += 1
    for i, r in enumerate(rungs):
        ax.axvline(r, color="0.4", ls="--", lw=0.8, label="rungs" if i == 0 else None)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("training fraction t̂")
    ax.set_ylabel("smoothed training loss")
    ax.set_title(f"Loss curves ({drawn} of {len(trials)} trials with data)")
    ax.grid(alpha=0.3)
    _robust_ylim(ax, ys)
    if drawn == 0:
        ax.text(0.5, 0.5, "no trial has reported yet", ha="center", va="center", transform=ax.transAxes)
    if palette.by_value:
        ax.set_title(f"Loss curves ({drawn} of {len(trials)} trials with data; × stopped; finished ones named)")
    _color_bar(fig, ax, palette)
    _legend(ax, min(finished, LEGEND_MAX) + 1 if palette.by_value else len(trials))
    return _save(fig, path)


def plot_normalized(
    trials: Sequence[TrialRecord],
    labels: dict[str, str],
    divisors: dict[str, tuple[float, str]],
    predictor: Any,
    path: Path,
) -> Path:
    """Each curve divided by its final loss (solid) or by its latest predicted final loss
    (thin); ℓ̂ of each distinct controls dashed (when a predictor is given)."""
    fig, ax = _figure()
    palette = trial_palette({rec.trial_id: rec.config for rec in trials})
    color_of = palette.colors
    ys: list[np.ndarray] = []
    drawn = finished = 0
    for rec in trials:
        t, y = clean_history(rec.history)
        if len(t) == 0 or rec.trial_id not in divisors:
            continue
        div, kind = divisors[rec.trial_id]
        label = f"{rec.trial_id}: {labels.get(rec.trial_id, '')}".rstrip(": ")
        label += " (÷ final)" if kind == "final" else " (÷ predicted final)"
        ell = equations.normalized_loss(y, div)
        # Finished trials solid; stopped or running ones (÷ their predicted final) dotted, so
        # the two can be told apart at any line width.
        named = not palette.by_value or (kind == "final" and finished < LEGEND_MAX)
        finished += kind == "final"
        ax.plot(t, ell, color=color_of[rec.trial_id], lw=1.3 if kind == "final" else 1.1,
                ls="-" if kind == "final" else ":", label=label if named else None)
        ys.append(ell[t >= 0.05] if np.any(t >= 0.05) else ell)
        drawn += 1

    n_overlay = 0
    if predictor is not None:
        groups: dict[str, list[TrialRecord]] = {}
        for rec in trials:
            if rec.controls and not is_diverged(rec):
                groups.setdefault(json.dumps(rec.controls.to_dict(), sort_keys=True), []).append(rec)
        grid = np.linspace(0.01, 1.0, 200)
        for recs in groups.values():
            controls = controls_of(recs[0])
            if controls is None:
                continue
            try:
                ell = np.asarray(predictor.normalized_curve(grid, controls), dtype=np.float64)
                loss_curve = getattr(predictor, "loss_curve", None)
                if callable(loss_curve) and recs[0].trial_id in divisors:
                    # With an irreducible loss L̂ the predicted L/L(T) depends on L(T) itself.
                    div = divisors[recs[0].trial_id][0]
                    ell = equations.normalized_loss(loss_curve(grid, controls, div), div)
            except Exception:  # noqa: BLE001 - skip controls the predictor cannot draw
                continue
            c = controls.to_dict()
            desc = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in c.items() if k in ("tau", "tokens_per_param", "schedule"))
            color = color_of[recs[0].trial_id] if len(recs) == 1 else "black"
            if palette.by_value:  # many trials: one legend entry for every ℓ̂
                label = "ℓ̂ of each trial's controls (dashed)" if n_overlay == 0 else None
            else:
                label = f"ℓ̂ ({desc})"
            ax.plot(grid, ell, ls="--", lw=1.1, color=color, label=label)
            n_overlay += 1
    ax.axhline(1.0, color="0.5", lw=0.6)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("training fraction t̂")
    ax.set_ylabel("L(t̂) / L(T)")
    title = "Normalized curves (solid: finished, ÷ final loss; dotted: stopped or running, ÷ latest predicted final)"
    if predictor is None:
        title += "\nno predictor: ℓ̂ not drawn"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    _robust_ylim(ax, ys)
    if drawn == 0:
        ax.text(0.5, 0.5, "no curve with a known or predicted final loss", ha="center", va="center",
                transform=ax.transAxes)
    if palette.by_value:  # the line styles, since the trials have no legend entries
        ax.plot([], [], color="0.3", lw=1.1, ls=":", label="stopped or running (÷ predicted final)")
    _color_bar(fig, ax, palette)
    _legend(ax, min(finished, LEGEND_MAX) + 2 if palette.by_value else drawn + n_overlay)
    return _save(fig, path)


def plot_regret(curve: Sequence[dict[str, Any]], rung_rows: Sequence[dict[str, Any]], path: Path,
                reason: Optional[str] = None) -> Path:
    """Regret (final loss of the pick − best final loss) vs stop fraction per rule; the rung
    table's picks (true regrets only) as large markers. Without data, a figure stating ``reason``."""
    fig, ax = _figure(8.0, 5.0)
    if not curve:
        _message(ax, "Regret vs stop fraction not available:\n" + (reason or "no data"))
        ax.set_title("Regret vs stop fraction")
        return _save(fig, path)
    for rule, style in RULE_STYLE.items():
        pts = [(r["stop_fraction"], r["regret"]) for r in curve if r["rule"] == rule and r["regret"] is not None]
        if not pts:
            continue
        s, reg = zip(*pts)
        ax.plot(s, reg, color=style["color"], marker=style["marker"], ms=4, lw=1.4,
                label=f"{style['label']}: every trial re-ranked on its history cut at s")
        rung_pts = [(r["rung_fraction"], r["regret"]) for r in rung_rows
                    if r["rule"] == rule and r.get("regret") is not None]
        if rung_pts:
            rs, rr = zip(*rung_pts)
            ax.scatter(rs, rr, s=90, facecolors="none", edgecolors=style["color"], lw=1.6,
                       label=f"{style['label']}: the live decision at the rung (it ranked only the "
                             "trials still running there)")
    # One far point (a very early s) must not squash the range the decisions live in: clip the
    # axis above the bulk and mark what lies beyond it.
    values = np.array([r["regret"] for r in curve if r["regret"] is not None], dtype=float)
    if values.size >= 3:
        bulk = float(np.quantile(values, 0.8))
        top = max(3.0 * bulk, 0.01)
        if float(values.max()) > 1.5 * top:
            ax.set_ylim(min(-0.05 * top, float(values.min())), top)
            for r in curve:
                if r["regret"] is not None and r["regret"] > top:
                    ax.annotate(f"↑ {r['regret']:.3g}", (r["stop_fraction"], top), xytext=(0, -12),
                                textcoords="offset points", ha="center", fontsize=8,
                                color=RULE_STYLE[r["rule"]]["color"])
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("stop fraction s (histories truncated at s)")
    ax.set_ylabel("regret = final loss of pick − best final loss")
    title = "Regret vs stop fraction"
    if reason:
        title += f"\n{reason}"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center")
    return _save(fig, path)


def plot_rung_predictions(rungs: Sequence[Any], labels: dict[str, str], finals: dict[str, float], path: Path,
                          reason: Optional[str] = None,
                          configs: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Path:
    """Each trial's predicted final loss ±1σ at each rung (the decision log), filled where the
    rung kept it and hollow where it stopped it (or would have, in audit), and the true final
    of every trial that finished at t̂ = 1: what a sweep shows without audit. ``configs``
    (trial id → config) colour a large sweep by its searched value (:func:`trial_palette`)."""
    fig, ax = _figure(9.0, 5.5)
    ids = sorted({tid for rung in rungs for tid in rung.entries}, key=lambda t: (labels.get(t, ""), t))
    palette = trial_palette({tid: (configs or {}).get(tid) or {} for tid in ids})
    colors = palette.colors
    spread = 0.03 / max(len(ids), 1)
    drawn = 0
    for k, tid in enumerate(ids):
        x_off = (k - (len(ids) - 1) / 2) * spread
        for rung in rungs:
            entry = rung.entries.get(tid)
            if entry is None or entry.predicted_final_loss is None:
                continue
            stopped = entry.decision.stopped
            ax.errorbar(rung.fraction + x_off, entry.predicted_final_loss, yerr=entry.uncertainty or 0.0,
                        fmt="o", ms=6, capsize=2, lw=1.0, color=colors[tid],
                        mfc="white" if stopped else colors[tid], mew=1.4)
            drawn += 1
        if tid in finals:
            ax.plot(1.0 + x_off, finals[tid], marker="*", ms=11, color=colors[tid], ls="none")
    if not drawn:
        _message(ax, "No rung has predicted a trial yet" + (f":\n{reason}" if reason else ""))
        ax.set_title("Predicted final loss at each rung")
        return _save(fig, path)
    # Direct labels at the right edge (one per trial; with many trials, the finished ones, and
    # the colour bar for the rest) instead of a legend beside the axes; stacked, never overlapping.
    placed: list[tuple[str, float]] = []
    for tid in ids:
        last = [(r.fraction, r.entries[tid].predicted_final_loss) for r in rungs
                if tid in r.entries and r.entries[tid].predicted_final_loss is not None]
        if last and (not palette.by_value or tid in finals):
            placed.append((tid, finals.get(tid, last[-1][1])))
    low, high = ax.get_ylim()
    for (tid, _), y in zip(placed, _spread([y for _, y in placed], 0.03 * (high - low))):
        ax.annotate(labels.get(tid) or tid, (1.0, y), xytext=(8, 0), textcoords="offset points",
                    fontsize=7, color=colors[tid], va="center", annotation_clip=False)
    _color_bar(fig, ax, palette)
    from matplotlib.lines import Line2D

    key = [Line2D([], [], marker="o", color="0.3", ls="none", label="kept at the rung (±1σ)"),
           Line2D([], [], marker="o", color="0.3", mfc="white", ls="none", label="stopped at the rung"),
           Line2D([], [], marker="*", color="0.3", ms=10, ls="none", label="true final (finished trials)")]
    ax.legend(handles=key, fontsize=8, loc="upper center")
    ax.set_xlim(0.0, 1.25)
    ax.set_xticks(sorted({r.fraction for r in rungs} | {1.0}))
    ax.set_xlabel("rung t̂ (1.0: end of training)")
    ax.set_ylabel("predicted final loss")
    ax.set_title("What the sweep knows without audit: predicted finals at each rung and the decision\n"
                 "(regret needs every trial's final loss: run with --audit for it)", fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


#: A colour per method in :func:`plot_replay` (the keep rules and Ray's median stopping).
METHOD_COLORS = {"collapse": "tab:blue", "current-best": "tab:orange", "asha": "tab:red", "median": "tab:green",
                 "paired-test": "tab:purple", "top-k": "tab:brown"}


def plot_replay(points: Sequence[Any], stop_at: Sequence[dict[str, Any]], noise: Optional[float], path: Path,
                title: str) -> Path:
    """``hpo replay``'s plot: mean regret against mean compute over the replayed sweeps, a point
    per rule setting (``hpo.trials.rule_replay.Point``: method, setting, compute, regret, default)
    coloured by method, the shipped default ringed; ``stop_at`` (s, compute, predicted-best and
    current-best mean regret) as labelled markers; the noise yardstick dotted."""
    fig, ax = _figure(8.0, 5.0)
    for method, color in METHOD_COLORS.items():
        mine = [p for p in points if p.method == method]
        if mine:
            ax.scatter([p.compute for p in mine], [p.regret for p in mine], s=18, color=color, alpha=0.75,
                       label=method)
    for p in points:
        if p.default:
            ax.scatter([p.compute], [p.regret], s=140, facecolors="none", edgecolors="black", lw=1.5,
                       label=f"default ({p.setting})")
    for rule, style in RULE_STYLE.items():
        pts = [(r["compute"], r[f"regret_{rule.split('_')[0]}"], r["s"]) for r in stop_at]
        if pts:
            ax.plot([c for c, _, _ in pts], [g for _, g, _ in pts], color=style["color"], marker=style["marker"],
                    ms=6, lw=1.0, ls="--", label=f"{style['label']}: every trial stopped at s")
            for c, g, s in pts:
                ax.annotate(f"s {s:g}", (c, g), xytext=(4, 4), textcoords="offset points", fontsize=7,
                            color=style["color"])
    if noise:
        ax.axhline(noise, color="0.4", ls=":", lw=1, label=f"noise {noise:.4f}")
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("mean compute (fraction of the full sweeps)")
    ax.set_ylabel("mean regret = final loss of pick − best final loss")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)
