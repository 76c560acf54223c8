"""The calibration's report: ``calibration.json`` (:func:`calibration_summary`), its text
``calibration.md`` (:func:`calibration_markdown`) and the normalised-curve figure
(:func:`render_normalized`), from what :mod:`hpo.calibration.fit` measured. Nothing here
writes a file: the fit writes every output once all of them are ready.
"""

from __future__ import annotations

import io
import math
from typing import Any, Optional

import numpy as np
import pandas as pd

from hpo.calibration import held_out
from hpo.calibration.size_choice import CHOICE_FRACTIONS_MAX, CHOICE_NOISE_Z, MIN_FOLD_SIZES
from hpo.common.tables import markdown_table
from predictors import equations


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
    """The leave-one-size-out comparison of the size methods for the report: per method its
    score and its error per held-out size; and every paired comparison the choice made (per
    held-out curve of every fold)."""
    if choice is None or not choice.held:
        return {}
    out: dict[str, Any] = {}
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
    return {"methods": out, "paired": [c.to_dict() for c in getattr(choice, "comparisons", ())]}


def calibration_summary(curves: list, results: dict[bool, Any], chosen_mode: bool,
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
    """The text of ``calibration.md`` for a :func:`hpo.calibration.fit.fit_and_report` summary."""
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
    """The leave-one-size-out comparison of the size methods (one row per method and size), and
    the paired differences the choice used (one row per comparison and fold)."""
    rows, paired_rows = [], []
    for mode, info in modes.items():
        comparison = info.get("size_comparison") or {}
        for name, entry in (comparison.get("methods") or {}).items():
            for g in entry["per_size"]:
                where = f"{'inside' if g['inside'] else 'beyond'}, {g['distance']:.2f}"
                rows.append([mode, name + (" (chosen)" if entry["chosen"] else ""), f"{g['n_params']:.3g}", where,
                             g["n"], _per_s(g["rms"], 2), _per_s(g["bias"], 2)])
            rows.append([mode, name, "score", "", "", f"{100 * entry['score']:.2f}%", ""])
        for c in comparison.get("paired") or []:
            folds: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
            for p in c["pairs"]:
                folds.setdefault((p["scheme"], p["n_params"], p["inside"], p["distance"]), []).append(p)
            label = f"{c['richer']} vs {c['simpler']}"
            for (scheme, n, inside, distance), pairs in folds.items():
                differ = [p["simpler_error"] - p["richer_error"] for p in pairs if not p["coincide"]]
                paired_rows.append([mode, label, scheme, f"{n:.3g}", f"{'inside' if inside else 'beyond'}, {distance:.2f}",
                                    len(pairs), len(pairs) - len(differ),
                                    f"{100 * np.mean([p['simpler_error'] for p in pairs]):.2f}%",
                                    f"{100 * np.mean([p['richer_error'] for p in pairs]):.2f}%",
                                    f"{100 * np.mean(differ):+.2f}%" if differ else "no evidence", ""])
                label = ""
            noise = c["noise"]
            paired_rows.append([mode, "", "all folds", "", "", c["n_pairs"], c["n_pairs"] - c["n_differ"], "", "",
                                f"{100 * c['gain']:+.2f}%" if c["n_differ"] else "no evidence",
                                ("n/a (fewer than 2 differ)" if noise is None
                                 else f"{100 * c['z'] * noise:.2f}%: {'richer' if c['beats'] else 'simpler'}")])
    if not rows:
        return []
    whys = [f"- {mode}: {info['size_choice_rule']}" for mode, info in modes.items() if info.get("size_choice_rule")]
    lines = ["", "## Model size in the prediction", "",
             "Each model size predicted by a refit without it (leave-one-size-out) and every size beyond the ones "
             "up to (down from) each size (the extrapolations), per way of bringing N into the prediction "
             "(simplest first). Where: inside or beyond the sizes the refit saw, and |log| distance to the nearest.",
             "", markdown_table(["mode", "method", "held-out N", "where", "curves", f"RMS, s = {s_words}",
                                 f"bias, s = {s_words}"], rows)]
    if paired_rows:
        lines += ["", "### Paired differences behind the choice", "",
                  f"Each held-out curve of each fold (refits that saw at least {MIN_FOLD_SIZES} sizes) predicted by "
                  f"both methods; error: the mean over s ≤ {CHOICE_FRACTIONS_MAX:g} of |relative error of the final|. "
                  "A curve where the two predictions coincide adds no evidence; the gain (simpler − richer error) "
                  "is the mean over the curves where they differ, and its noise combines the spread of those "
                  "differences with the seed noise of the true finals (each curve counted once). A richer method "
                  f"is chosen only when it beats every simpler one by more than {CHOICE_NOISE_Z:g}× that noise; "
                  "among those, the lowest score.", "",
                  markdown_table(["mode", "comparison", "fold", "held-out N", "where", "curves", "coincide",
                                  "simpler's error", "richer's error", "gain (mean where they differ)",
                                  f"{CHOICE_NOISE_Z:g}× noise: verdict"], paired_rows)]
    return lines + ["", "Chosen:", "", *whys]


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
    from hpo.common.tables import markdown_table
    from predictors.kinds import SWEEP_KINDS

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


def render_normalized(curves: list, predictor: Any) -> bytes:
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
