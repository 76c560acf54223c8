"""The results half of ``benchmarks/audit_regret.py``: what the audit found, summed up and written.

What lives here: the names of the selection rules, the records of the results (:class:`Case`:
one rule's pick on one replicate; :class:`Cell`: cases summed up; :class:`SweepReport`,
:class:`AuditReport`), their summaries (:func:`summarise`, :func:`sweep_sentence`) and the
output: the markdown tables and report (:func:`render`, :func:`missing_summary`) and the plot
(:func:`plot`).

Why apart: ``benchmarks/audit_regret.py`` does the measuring (bank views, the scheduler's
predictions and keep rule, scoring each replicate) and the command line; this module only
reads its results. Every definition (regret, seed band, tie) is stated in the docstring of
``benchmarks/audit_regret.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from hpo.common.tables import markdown_table as md_table


# The selection rules, by the names the report gives them.
CURRENT = "current-best"
PRED_FITTED = "predicted-best (m fitted)"
PRED_PAPER = "predicted-best (m = 0.05)"
KEEP = "keep-set (ranking margin)"


# ---------------------------------------------------------------------- results


@dataclass
class Case:
    """One rule's pick at one stop fraction in one replicate of one sweep."""

    sweep: str
    rule: str
    fraction: float
    seed: int
    pick_label: Optional[str]
    pick_run: Optional[str]
    regret: Optional[float]  # final(pick) − min final of the replicate (∞: picked a diverged run)
    tie: Optional[bool]  # regret ≤ band (None: no band yet)
    mean_regret: Optional[float]  # seed-mean final of the pick's configuration − best seed-mean
    compute: float  # Σ t̂ trained / n trials
    n_trials: int
    keep_size: Optional[int] = None
    best_in_keep: Optional[bool] = None
    note: str = ""


@dataclass
class Cell:
    """A rule at one s in one sweep (or overall): the cases summarised."""

    n: int
    mean: Optional[float]
    spread: Optional[float]  # sd across replicates (ddof=1; 0 with one replicate)
    ties: int
    tie_known: int
    mean_vs_seed_mean: Optional[float]
    spread_vs_seed_mean: Optional[float]
    compute: Optional[float]
    keep_size: Optional[float] = None
    best_in_keep: Optional[int] = None


@dataclass
class SweepReport:
    name: str
    labels: list[str]
    seeds: list[int]
    complete_seeds: list[int]
    finals: dict[str, dict[int, Optional[float]]]  # label → seed → final (complete replicates)
    seed_mean: dict[str, float]
    sigma_seed: Optional[float]
    band: Optional[float]
    noise_configs: int
    n_trials: int = 0  # sweep × seed × configuration entries
    n_scorable: int = 0  # of those, banked and complete
    cases: list[Case] = field(default_factory=list)
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)  # rule → f"{s:g}" → Cell
    sentence: str = ""


@dataclass
class AuditReport:
    fractions: list[float]
    rules: list[str]
    sweeps: dict[str, SweepReport]
    missing: list[dict[str, Any]]
    n_runs: int
    overall: dict[str, dict[str, Cell]] = field(default_factory=dict)
    e_of_s: dict[str, float] = field(default_factory=dict)
    predictors: dict[str, Any] = field(default_factory=dict)


def _stats(values: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float]]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    arr = np.asarray(vals, dtype=float)
    mean = float(arr.mean())
    spread = float(arr.std(ddof=1)) if arr.size > 1 and np.all(np.isfinite(arr)) else (0.0 if arr.size == 1 else math.inf)
    return mean, spread


def summarise(cases: Sequence[Case]) -> Cell:
    mean, spread = _stats([c.regret for c in cases])
    m_mean, m_spread = _stats([c.mean_regret for c in cases])
    keep = [c for c in cases if c.keep_size is not None]
    return Cell(
        n=len(cases), mean=mean, spread=spread,
        ties=sum(1 for c in cases if c.tie), tie_known=sum(1 for c in cases if c.tie is not None),
        mean_vs_seed_mean=m_mean, spread_vs_seed_mean=m_spread,
        compute=float(np.mean([c.compute for c in cases])) if cases else None,
        keep_size=float(np.mean([c.keep_size for c in keep])) if keep else None,
        best_in_keep=sum(1 for c in keep if c.best_in_keep) if keep else None,
    )


def sweep_sentence(report: SweepReport, fractions: Sequence[float], predicted_rules: Sequence[str]) -> str:
    """Where current-best is as good as each predicted-best rule: mean regrets within the band."""
    name = report.name
    if not report.complete_seeds:
        return f"{name}: no complete replicate yet."
    if report.band is None:
        return (f"{name}: no seed band yet ({len(report.complete_seeds)} complete replicate(s); "
                f"σ_seed needs 2), so no tie call.")
    parts = []
    for rule in predicted_rules:
        same, worse, better = [], [], []
        for s in fractions:
            cur = report.cells[CURRENT][f"{s:g}"].mean
            pred = report.cells[rule][f"{s:g}"].mean
            if cur is None or pred is None:
                continue
            diff = cur - pred
            tag = f"{s:g}"
            if abs(diff) <= report.band or (math.isinf(cur) and math.isinf(pred)):
                same.append(tag)
            elif diff > 0:
                worse.append(f"{tag} ({_fmt(cur)} vs {_fmt(pred)})")
            else:
                better.append(f"{tag} ({_fmt(cur)} vs {_fmt(pred)})")
        text = f"vs {rule}: as good at s = {', '.join(same) or 'none'}"
        if worse:
            text += f"; worse beyond the band at s = {', '.join(worse)}"
        if better:
            text += f"; better beyond the band at s = {', '.join(better)}"
        parts.append(text)
    reps = len(report.complete_seeds)
    return (f"{name} (band {_fmt(report.band)}, {reps} replicate(s)): current-best "
            + "; ".join(parts) + ".")


# ---------------------------------------------------------------------- output


def _fmt(value: Optional[float], digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "∞ (diverged)"
    return f"{value:.{digits}f}"


def cell_text(cell: Cell, rule: str) -> str:
    if not cell.n:
        return "—"
    text = f"{_fmt(cell.mean)} ± {_fmt(cell.spread)}"
    if cell.tie_known == cell.n:
        text += f" ({cell.ties}/{cell.n} ties)"
    elif cell.tie_known == 0:
        text += " (ties n/a: no band)"
    else:  # pooled over sweeps with and without a band
        text += f" ({cell.ties}/{cell.tie_known} ties, {cell.n - cell.tie_known} without band)"
    if rule == KEEP and cell.keep_size is not None:
        text += f", |K| {cell.keep_size:.1f}, best∈K {cell.best_in_keep}/{cell.n}, compute {cell.compute:.2f}"
    return text


def regret_table(cells: Mapping[str, Mapping[str, Cell]], fractions: Sequence[float], seed_mean: bool = False) -> str:
    rows = []
    for rule, by_s in cells.items():
        if seed_mean:
            rows.append([rule, *(f"{_fmt(by_s[f'{s:g}'].mean_vs_seed_mean)} ± {_fmt(by_s[f'{s:g}'].spread_vs_seed_mean)}"
                                 if by_s[f"{s:g}"].n else "—" for s in fractions)])
        else:
            rows.append([rule, *(cell_text(by_s[f"{s:g}"], rule) for s in fractions)])
    return md_table(["rule", *(f"s = {s:g}" for s in fractions)], rows)


def finals_table(report: SweepReport) -> str:
    seeds = report.complete_seeds
    rows = [[lab, *(_fmt(report.finals[lab].get(s) if report.finals[lab].get(s) is not None else math.inf)
                    for s in seeds), _fmt(report.seed_mean.get(lab))] for lab in report.labels]
    return md_table(["configuration", *(f"seed {s}" for s in seeds), "seed mean"], rows)


def render(report: AuditReport, with_missing: bool = True) -> str:
    fr = report.fractions
    n_missing = len({m["run_id"] for m in report.missing})
    lines = ["# Audit regret: predicted-best vs current-best", "",
             f"Runs: {report.n_runs - n_missing} of {report.n_runs} scorable; "
             f"stop fractions s = {', '.join(f'{s:g}' for s in fr)}; "
             "e(s) = " + ", ".join(f"{k}: {100 * v:.2f}%" for k, v in report.e_of_s.items()) + ".", "",
             "Cells: mean regret over replicates ± sd across replicates (loss units; regret = final of the "
             "pick − best final of that replicate), then ties/replicates (tie: regret ≤ band = √2·σ_seed). "
             "Keep-set: |K| = mean size, best∈K = replicates whose keep-set holds the true best, compute = "
             "mean Σ t̂ trained / n (all kept trials finished). Seed means and σ_seed use complete "
             "replicates only.", ""]
    for name, fit in report.predictors.items():
        lines.append(f"- {name}: {fit}")
    lines += ["", "## Seed band", ""]
    lines.append(md_table(
        ["sweep", "runs scorable", "complete replicates", "σ_seed", "band √2·σ", "configs with ≥ 2 seeds"],
        [[r.name, f"{r.n_scorable}/{r.n_trials}",
          f"{len(r.complete_seeds)}/{len(r.seeds)} ({', '.join(map(str, r.complete_seeds)) or '-'})",
          _fmt(r.sigma_seed), _fmt(r.band), str(r.noise_configs)] for r in report.sweeps.values()]))
    lines += ["", "## Verdict per sweep", ""] + [f"- {r.sentence}" for r in report.sweeps.values()]
    lines += ["", "## Overall (all sweeps × replicates)", "", regret_table(report.overall, fr)]
    for r in report.sweeps.values():
        lines += ["", f"## {r.name}", ""]
        if not r.complete_seeds:
            lines.append("No complete replicate yet.")
            continue
        lines += [finals_table(r), "", "Regret within the replicate:", "", regret_table(r.cells, fr), "",
                  "Regret against the seed-mean finals:", "", regret_table(r.cells, fr, seed_mean=True)]
    if report.missing and with_missing:
        lines += ["", f"## Missing ({len(report.missing)} sweep × seed × configuration entries)", ""]
        lines += [md_table(["sweep", "seed", "configuration", "run_id", "why"],
                           [[m["sweep"], str(m["seed"]), m["label"], m["run_id"], m["why"]] for m in report.missing])]
    return "\n".join(lines) + "\n"


def missing_summary(report: AuditReport) -> str:
    """One line per sweep × seed with missing runs (the full list is in the markdown)."""
    groups: dict[tuple[str, int], list[str]] = {}
    for m in report.missing:
        groups.setdefault((m["sweep"], m["seed"]), []).append(m["label"] if m["why"] == "not banked"
                                                              else f"{m['label']} ({m['why']})")
    return "\n".join(f"  {sweep} seed {seed}: {len(labels)} missing: {'; '.join(labels)}"
                     for (sweep, seed), labels in groups.items())


def plot(report: AuditReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = list(report.sweeps.values())
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 3.8), squeeze=False)
    styles = {CURRENT: ("C0", "o", "-"), PRED_FITTED: ("C1", "s", "-"), PRED_PAPER: ("C2", "^", "-"),
              KEEP: ("C3", "d", "--")}
    fr = np.asarray(report.fractions)
    for ax, r in zip(axes[0], sweeps):
        ax.set_title(f"{r.name} ({len(r.complete_seeds)} repl.)")
        ax.set_xlabel("stop fraction s")
        if not r.complete_seeds:
            ax.text(0.5, 0.5, "no complete replicate", transform=ax.transAxes, ha="center")
            continue
        if r.band is not None:
            ax.axhspan(0.0, r.band, color="0.85", label="seed band √2σ")
        for k, rule in enumerate(report.rules):
            means = [r.cells[rule][f"{s:g}"].mean for s in report.fractions]
            spreads = [r.cells[rule][f"{s:g}"].spread for s in report.fractions]
            y = np.array([m if m is not None and math.isfinite(m) else np.nan for m in means])
            e = np.array([v if v is not None and math.isfinite(v) else 0.0 for v in spreads])
            colour, marker, ls = styles.get(rule, (f"C{k}", "o", "-"))
            x = fr + (k - 1.5) * 0.004  # small offsets so equal regrets stay visible
            ax.errorbar(x, y, yerr=e, color=colour, marker=marker, ls=ls, capsize=2, label=rule)
        ax.set_ylim(bottom=0.0)
    axes[0][0].set_ylabel("regret (final loss − best final)")
    handles: dict[str, Any] = {}  # one legend for all panels (the band may be in some only)
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        axes[0][-1].legend(list(handles.values()), list(handles), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
