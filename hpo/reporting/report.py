"""The sweep report: what each selection rule would have picked, at what compute, and how
much it cost (``hpo report <output>``; also written at the end of ``hpo sweep``).

Input: ``<output>/scheduler_state.json`` (:class:`hpo.decisions.scheduler_state.SchedulerState`) and,
when present, ``<output>/predictor.json``, analysed by :mod:`hpo.reporting.analysis` (every number and
what it means). This module renders that analysis; it writes ``<output>/report/`` with

* ``report.csv``  one row per rung × rule (columns :data:`hpo.reporting.analysis.CSV_COLUMNS`),
* ``report.md``   summary, the rung table, compute used, the early answer, regret vs stop
  fraction (audit sweeps) and notes on what "regret" means for this sweep,
* ``curves.png``, ``normalized.png``, ``regret.png`` (drawn by :mod:`hpo.reporting.plots`),

and prints the compact terminal table (:func:`print_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from hpo.reporting.analysis import CSV_COLUMNS, RULE_LABELS, Analysis, Report, analyse, config_label, final_loss
from hpo.reporting.plots import plot_curves, plot_normalized, plot_regret, plot_rung_predictions
from hpo.common.tables import markdown_table
from predictors.io import atomic_write_text, atomic_write_with, finite_or_none
from predictors.run_keys import METRIC_WORDS

REPORT_DIR = "report"


# ----------------------------------------------------------------------------- writing
def write_report(output_dir: str | Path, *, predictor: Any = None, plots: bool = True) -> Report:
    """Analyse ``<output_dir>/scheduler_state.json`` and write ``<output_dir>/report/``.

    ``predictor`` (anything with ``predict_final`` and ``normalized_curve``) overrides
    ``<output_dir>/predictor.json``; without either, predictions come from the decision log
    only. ``plots=False`` skips the PNGs (tables only). Raises
    :class:`hpo.decisions.scheduler_state.StateFileError` on a missing/malformed state.
    """
    analysis = analyse(output_dir, predictor=predictor)
    report = analysis.report
    out = Path(output_dir) / REPORT_DIR
    report.paths["csv"] = _write_csv(report, out / "report.csv")
    if plots:
        _write_plots(analysis, out)
    else:
        report.notes.append("Plots not drawn (plots=False).")
    report.paths["md"] = atomic_write_text(out / "report.md", render_markdown(report, analysis))
    return report


def _write_csv(report: Report, path: Path) -> Path:
    import pandas as pd

    frame = pd.DataFrame(report.rows, columns=list(CSV_COLUMNS))
    return atomic_write_with(path, lambda tmp: frame.to_csv(tmp, index=False))


def _write_plots(analysis: Analysis, out: Path) -> None:
    report = analysis.report
    trials = analysis.ordered()
    labels = {rec.trial_id: analysis.label(rec.trial_id) for rec in trials}
    rungs = [r.fraction for r in analysis.state.rungs]
    divisors = analysis.divisors()
    if regret_reason := analysis.regret_unavailable_reason():
        report.notes.append(f"regret.png: {regret_reason}")

    jobs = {
        "curves": lambda p: plot_curves(trials, labels, rungs, p),
        "normalized": lambda p: plot_normalized(trials, labels, divisors, analysis.predictor, p),
        # Without audit the regret is unknowable (stopped trials have no final): the figure
        # shows the rung predictions and decisions instead of an empty box.
        "regret": (lambda p: plot_regret(report.regret_curve, report.rows if report.regret_is_true else [], p,
                                         reason=regret_reason)) if report.regret_curve else
                  (lambda p: plot_rung_predictions(
                      analysis.state.rungs, labels,
                      {rec.trial_id: f for rec in trials if (f := final_loss(rec)) is not None}, p,
                      reason=regret_reason, configs={rec.trial_id: rec.config for rec in trials})),
    }
    for name, job in jobs.items():
        path = out / f"{name}.png"
        try:
            report.paths[name] = job(path)
        except Exception as exc:  # noqa: BLE001 - a broken plot must not lose the report
            report.notes.append(f"{path.name} could not be drawn: {exc}")


def parent_table(report: Report) -> str:
    """The rung table of report.md (markdown), for the MLflow parent run's description."""
    return "\n".join(_rung_section(report, None)).strip()


def pick_final_loss(report: Report) -> Optional[float]:
    """The true final loss of the early answer's pick, once that trial finished (else None)."""
    pick = (report.early_answer or {}).get("trial_id")
    finals = [r["final_loss_of_pick"] for r in report.rows if r["trial_id"] == pick]
    return next((float(f) for f in finals if finite_or_none(f) is not None), None)


def _fmt(value: Any, spec: str = ".4f") -> str:
    v = finite_or_none(value)
    return "—" if v is None else format(v, spec)


# ----------------------------------------------------------------------------- markdown
def render_markdown(report: Report, analysis: Optional[Analysis] = None) -> str:
    """The text of ``report.md``: its sections in order."""
    lines: list[str] = ["# Sweep report", ""]
    for section in (_summary_section, _rung_section, _compute_section, _best_kept_section, _early_answer_section,
                    _regret_section, _notes_section, _plots_section):
        lines += section(report, analysis)
    return "\n".join(lines)


def _summary_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """The summary: output, mode, trials, rungs, best final, whether regret is true."""
    lines: list[str] = []
    state = analysis.state if analysis else None
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.status_counts.items())) or "none"
    mode = _mode(analysis)
    lines += ["## Summary", ""]
    lines.append(f"- Output directory: `{report.output_dir}`")
    if state and state.updated_at:
        lines.append(f"- State updated at: {state.updated_at}")
    lines.append(f"- Scheduler mode: {mode}; trials: {sum(report.status_counts.values())} ({counts})")
    if state and state.settings.get("metric"):
        metric = str(state.settings["metric"])
        lines.append(f"- Decided on: `{metric}` ({METRIC_WORDS.get(metric, 'the reported metric')}); every loss "
                     "below is that metric")
    if state:
        decided = sum(1 for r in state.rungs if r.decided)
        lines.append(f"- Rungs: {', '.join(f'{r.fraction:g}' for r in state.rungs) or 'none'} "
                     f"({decided} decided)")
    if report.best_trial is not None:
        which = "best final loss" if report.regret_is_true else "best final loss among trials that finished"
        lines.append(f"- {which}: {report.best_final_loss:.4f} (trial {report.best_trial}"
                     + (f"; {analysis.label(report.best_trial)}" if analysis else "") + ")")
    lines.append("- Regret: " + ("**true regret** (every trial's final loss is known)" if report.regret_is_true
                                 else "**n/a** (not every trial's final loss is known; see Notes)"))
    lines.append("")
    return lines


def _rung_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """The rung table: each rule's pick at each rung, its prediction, final and regret."""
    lines: list[str] = []
    lines += ["## Rung table", ""]
    if report.rows:
        table = []
        for r in report.rows:
            pred = _fmt(r["predicted_final_loss"])
            if finite_or_none(r["uncertainty"]) is not None and pred != "—":
                pred += f" ± {r['uncertainty']:.4f}"
            regret = _fmt(r["regret"])
            if finite_or_none(r["regret_pct"]) is not None:
                regret += f" ({r['regret_pct']:.2f}%)"
            table.append([f"{r['rung_fraction']:g}", r["rung_status"], RULE_LABELS[r["rule"]], r["trial_id"] or "—",
                          r["config"] or "—", _fmt(r["smoothed_loss"]), pred, _fmt(r["final_loss_of_pick"]), regret,
                          r["regret_kind"], _fmt_pct(r["compute_fraction"])])
        lines.append(markdown_table(
            ["rung t̂", "status", "rule", "pick", "config", "loss at rung", "predicted final ± 1σ",
             "final of pick", "regret", "regret kind", "compute at rung"], table))
    else:
        lines.append("No rungs in the scheduler state.")
    lines.append("")
    return lines


def _compute_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """Compute used against the full sweep (and, in audit mode, had the stops been applied)."""
    lines: list[str] = []
    state = analysis.state if analysis else None
    lines += ["## Compute used", ""]
    weights = "N·D per trial" if report.compute_weighted else "equal weights per trial"
    lines.append(f"- Compute used against a full sweep (every trial to t̂ = 1): "
                 f"**{_fmt_pct(report.compute_fraction)}** (Σ t̂_i·N_i·D_i / Σ N_i·D_i, {weights}).")
    if report.compute_fraction_if_stopped is not None:
        lines.append(f"- Audit mode stops nothing, so every trial ran as far as it got: the figure above is the "
                     f"audit's own cost. Had each trial been stopped at the rung where the scheduler would have "
                     f"stopped it (`would_stop_at` in scheduler_state.json), the sweep would have used "
                     f"**{_fmt_pct(report.compute_fraction_if_stopped)}** (Σ min(t̂_i, stop_i)·N_i·D_i / Σ N_i·D_i): "
                     "the compute early stopping would have saved, at the regret the rung table shows.")
    if state:
        for rung in state.rungs:
            if rung.decided and rung.compute_fraction is not None:
                lines.append(f"- Rung {rung.fraction:g} decided at {_fmt_pct(rung.compute_fraction)} of the full sweep.")
    lines.append("")
    return lines


def _best_kept_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """Whether the true best survived each rung, and why."""
    lines: list[str] = []
    mode = _mode(analysis)
    if report.best_at_rungs:
        best = report.best_at_rungs[0]["trial_id"]
        lines += ["## Was the true best kept?", ""]
        lines.append(f"The true best is trial {best}" + (f" ({_md(analysis.label(best))})" if analysis else "")
                     + f", final loss {_fmt(report.best_final_loss)}. At each rung:")
        lines.append("")
        lines.append(markdown_table(["rung t̂", "the true best", "why"],
                                    [[f"{b['rung_fraction']:g}", _best_words(b, mode), _md(b["reason"] or "")]
                                     for b in report.best_at_rungs]))
        lines.append("")
    return lines


def _early_answer_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """The early answer as announced (and revised), with its final loss when known."""
    lines: list[str] = []
    lines += ["## Early answer", ""]
    ea = report.early_answer
    if ea:
        cfg = ea.get("config")
        cfg_text = config_label(cfg, analysis.labels_keys if analysis else list((cfg or {}).keys()), 200) \
            if isinstance(cfg, dict) else str(cfg)
        unc = finite_or_none(ea.get("uncertainty"))
        lines.append(f"- Trial {ea.get('trial_id')} ({_md(cfg_text)}), announced at rung t̂ = {ea.get('rung')}")
        lines.append(f"- Predicted final loss {_fmt(ea.get('predicted_final_loss'))}"
                     + (f" ± {unc:.4f}" if unc is not None else ""))
        lines.append(f"- Compute spent when announced: {_fmt_pct(ea.get('compute_fraction'))}")
        # The numbers behind the terminal's short answer (hpo.decisions.early_answer) live here.
        if ea.get("probability_best") is not None:
            lines.append(f"- P(best) among the {ea.get('n_candidates')} trials ranked at the last rung, under the "
                         f"order's measured ranking error: {100 * float(ea['probability_best']):.0f}%")
        if ea.get("order"):
            lines.append(f"- Order: {_md(str(ea['order']))}, blend weight {ea.get('order_weight')} "
                         f"(1 = predicted finals, 0 = losses at the rung); kind of sweep {_md(str(ea.get('kind')))}")
        if ea.get("margin_text"):
            lines.append(f"- Keep-margin: {_md(str(ea['margin_text']))}")
        if finite_or_none(ea.get("value_error")) is not None:
            lines.append(f"- The predictor is calibrated for the order of the trials, not the value: the value is "
                         f"uncertain by ~{100 * float(ea['value_error']):.1f}%")
        if ea.get("kept_all"):
            lines.append(f"- The margin exceeded the spread of the predictions: kept all {len(ea.get('kept') or [])} trials")
        revised = ea.get("revised")
        if isinstance(revised, dict):
            lines.append(f"- Revised at {revised.get('at')}: replaces trial {revised.get('from')} "
                         f"({_md(str(revised.get('why')))})")
        tid = ea.get("trial_id")
        if analysis and tid in analysis.finals and analysis.finals[tid] is not None:
            fin = analysis.finals[tid]
            line = f"- Final loss of the early answer: {fin:.4f}"
            if report.regret_is_true:
                line += f"; regret {fin - report.best_final_loss:.4f}"
            lines.append(line)
    else:
        lines.append("No early answer yet (it is written when the last rung is decided).")
    lines.append("")
    return lines


def _regret_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """Regret of each rule against the stop fraction, from the complete histories."""
    lines: list[str] = []
    lines += ["## Regret vs stop fraction", ""]
    if report.regret_curve:
        lines.append("Recomputed from the complete histories truncated at each stop fraction s: "
                     "predicted-best = lowest `predict_final` on the truncated history, current-best = "
                     "lowest smoothed loss at s (the first point at or past s).")
        lines.append("")
        by_s: dict[float, dict[str, dict[str, Any]]] = {}
        for r in report.regret_curve:
            by_s.setdefault(r["stop_fraction"], {})[r["rule"]] = r
        table = []
        for s, rules in by_s.items():
            pb, cb = rules.get("predicted_best", {}), rules.get("current_best", {})
            table.append([f"{s:g}", pb.get("trial_id") or "—", _fmt(pb.get("regret")),
                          cb.get("trial_id") or "—", _fmt(cb.get("regret"))])
        lines.append(markdown_table(["s", "predicted-best pick", "regret", "current-best pick", "regret"], table))
    else:
        lines.append("Not computed: " + ((analysis.regret_unavailable_reason() or "n/a") if analysis else "n/a"))
    lines.append("")
    return lines


def _notes_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """What regret and the two rules mean, and the analysis's notes."""
    lines: list[str] = []
    lines += ["## Notes", ""]
    lines.append("- **Regret** of a rule at a stop point = final loss of the trial it picks − the best final "
                 "loss among all trials (paper §5). It is only a true regret when every trial ran to the "
                 "end; the rung table's `regret kind` column says which applies to each row.")
    lines.append("- **predicted-best** picks the lowest predicted final loss (partial curve aligned to ℓ̂); "
                 "**current-best** picks the lowest smoothed loss at the rung. Rung picks are taken from the "
                 "scheduler's decision log as recorded.")
    for note in report.notes:
        lines.append(f"- {note}")
    lines.append("")
    return lines


def _plots_section(report: Report, analysis: Optional[Analysis]) -> list[str]:
    """The plots written beside the report."""
    lines: list[str] = []
    plots_written = [(n, p) for n, p in report.paths.items() if n in ("curves", "normalized", "regret")]
    if plots_written:
        lines += ["## Plots", ""]
        for name, path in plots_written:
            lines.append(f"![{name}]({Path(path).name})")
        lines.append("")
    return lines


def _mode(analysis: Optional[Analysis]) -> str:
    """The scheduler's decision mode as its state records it."""
    state = analysis.state if analysis else None
    return (state.settings.get("decision_mode") if state else None) or "unknown"


def _best_words(b: dict[str, Any], mode: str = "audit") -> str:
    """What a rung did to the true best, in words."""
    verdict = b["verdict"]
    if verdict == "would stop":
        return "**would have been stopped here**" if mode == "audit" else "**dropped here** (had finished)"
    if verdict == "stopped":
        return "**stopped here**"
    if verdict == "out":
        return f"out since t̂ = {b['out_at']:g}"
    return verdict


def best_at_rungs_line(report: Report) -> Optional[str]:
    """One line: at which rungs the true best was kept, and where it would have been stopped."""
    if not report.best_at_rungs:
        return None
    kept = [f"{b['rung_fraction']:g}" for b in report.best_at_rungs if b["verdict"] == "kept"]
    lost = next((b for b in report.best_at_rungs if b["verdict"] in ("would stop", "stopped")), None)
    line = f"true best {report.best_at_rungs[0]['trial_id']} ({_fmt(report.best_final_loss)}): "
    line += f"kept at rung{'s' if len(kept) != 1 else ''} t̂ = {', '.join(kept)}" if kept else "kept at no rung"
    if lost is not None:
        line += f"; {'would have been ' if lost['verdict'] == 'would stop' else ''}stopped at t̂ = {lost['rung_fraction']:g}"
    return line


def _md(text: str) -> str:
    return (text or "").replace("|", "\\|")


def _fmt_pct(value: Any) -> str:
    v = finite_or_none(value)
    return "—" if v is None else f"{100 * v:.1f}%"


# ----------------------------------------------------------------------------- terminal
def early_answer_outcome(report: Report) -> Optional[str]:
    """Whether the early answer was right, once its trial finished: its final against the best
    final (of every trial, or of those that finished), and by how much it missed."""
    final, best = report.early_answer_final, report.best_final_loss
    if final is None or best is None or report.early_answer is None:
        return None
    among = "of every trial" if report.regret_is_true else "of the trials that finished"
    if str(report.early_answer.get("trial_id")) == report.best_trial:
        return f"  it finished at {final:.4f}, the best final {among}: the early answer was right"
    return (f"  it finished at {final:.4f}; the best {among} is {report.best_trial} ({report.best_label}) at "
            f"{best:.4f}: the early answer missed by {final - best:.4f}")


def print_report(report: Report, console: Any = None) -> None:
    """A compact rich table of the rung picks, compute used, early answer and paths."""
    from rich.console import Console
    from rich.table import Table

    from rich import box

    console = console or Console()
    # A light box and a config column never narrower than its longest "key=value," piece: at
    # 80 columns (any log or CI) rich then wraps configs between pieces, never inside one.
    table = Table(title="Sweep report: picks by rung", show_lines=False, box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    pieces = [piece for r in report.rows for piece in (r["config"] or "—").split(" ")]
    config_width = max((len(piece) for piece in pieces), default=6)
    for col, kw in (("rung", {"justify": "right", "no_wrap": True}), ("rule", {"no_wrap": True}),
                    ("pick", {"no_wrap": True}),
                    ("config", {"overflow": "fold", "ratio": 1, "min_width": config_width}),
                    ("pred. final", {"justify": "right", "max_width": 8}),
                    ("final of pick", {"justify": "right", "max_width": 8}),
                    ("regret", {"justify": "right", "min_width": 6})):
        table.add_column(col, **kw)
    for r in report.rows:
        regret = _fmt(r["regret"]) if r["regret"] is not None else "n/a"
        rung = f"{r['rung_fraction']:g}" + ("" if r["rung_status"] == "decided" else "*")
        table.add_row(rung, RULE_LABELS[r["rule"]], r["trial_id"] or "—", r["config"] or "—",
                      _fmt(r["predicted_final_loss"]), _fmt(r["final_loss_of_pick"]), regret)
    if report.rows:
        console.print(table)
        if any(r["rung_status"] != "decided" for r in report.rows):
            console.print("* rung not decided yet: provisional picks from the trials that reached it")
        console.print("pred. final: the pick's predicted final loss (±1σ calibrated error in report.md); it is "
                      "calibrated for ranking the trials of this sweep, and as an absolute value it can be "
                      "off by more than ±1σ away from the calibrated scale", soft_wrap=False, highlight=False)
    else:
        console.print("[yellow]No rungs in the scheduler state.[/yellow]")
    console.print("regret: " + ("true regret (every trial's final loss known)" if report.regret_is_true
                                else "n/a (trials stopped or running; see report.md)"))
    line = f"compute used: {_fmt_pct(report.compute_fraction)} of a full sweep"
    if report.compute_fraction_if_stopped is not None:
        line += (f" (audit: nothing stopped; stopping where it would have stopped trials: "
                 f"{_fmt_pct(report.compute_fraction_if_stopped)})")
    console.print(line, highlight=False)
    if (best_line := best_at_rungs_line(report)) is not None:
        console.print(best_line, highlight=False)
    ea = report.early_answer
    if ea:
        console.print(f"early answer: trial {ea.get('trial_id')} at t̂ = {ea.get('rung')}, predicted final "
                      f"{_fmt(ea.get('predicted_final_loss'))}")
        if isinstance(ea.get("revised"), dict):
            console.print(f"  revised: replaces trial {ea['revised'].get('from')} ({ea['revised'].get('why')})")
        if (outcome := early_answer_outcome(report)) is not None:
            console.print(outcome, highlight=False)
    for name, path in report.paths.items():
        console.print(f"  {name}: {path}", soft_wrap=True, highlight=False)
