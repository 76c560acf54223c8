"""Decisions that pay: every keep rule replayed on held-out sweeps of several corpora, judged at
equal quality, with every default chosen leave-one-corpus-out.

What: each decision bank (every trial run to the end, at TPPs and seeds no calibration uses) is
replayed through every method and each pick scored against the true finals. The banks span
three corpora (``DEFAULT_BANKS``): the stdlib (the shipped predictor's own corpus: five kinds of
sweep at 0.1M TPP 40, a 25-trial η × λ grid, the crossing kinds at 0.78M), Perl 5.36's library
and the Linux C headers (η at fixed τ and the two crossing kinds B and η at fixed λ, 0.1M, TPP
20 and 25, three seeds each).

Methods, all but median stopping through the one keep-rule seam (``hpo.decisions.keep``, in
``CollapseScheduler``):

* ``collapse``: the collapse rule; knobs: z, the rung set, the reduction factor, whether the
  sweep's own evidence widens σ; the shipped default (``SchedulerSettings()``) is marked;
* ``asha``: ASHA's rule (top 1/rf by loss) at rungs grace·rf^k; knobs grace, rf;
* ``current-best``: every trial to s, the lowest loss there to the end; knob s;
* ``paired-test`` (experimental): stop what a paired test on the curves shows worse; knobs rungs, z;
* ``top-k``: the k best by predicted final continue past each rung; knobs rungs, k;
* ``median``: Ray's ``MedianStoppingRule`` on t̂; knob grace.

Scoring (``hpo.trials.rule_replay``, the engine ``hpo replay`` uses): **compute** = Σ t̂ trained / n; **pick** = the
finished trial with the lowest final; **regret** = its final − the replicate's best final;
**σ_seed** = the pooled std of a configuration's final across seeds; **within** = regret ≤
σ_seed; **kept** = the true best trained to the end. A setting is **safe** on a set of
replicates when within ≥ 90% and kept ≥ 95% of them.

* **Equal-quality compute** of a method on a bank's kind: the least mean compute of any of its
  settings that is safe there (hindsight-best setting, the same rule for every method).
* **Leave-one-corpus-out**: for each corpus X, the predictor's order error is measured on the
  banks of the corpora that are neither X nor the fit's (``with_order_error_from``), every bank
  is replayed with that predictor, and the default (rungs, z, rf, evidence) is the cheapest
  collapse setting that is safe on every other corpus (``select_default``); only X's figures of
  that setting are reported as held-out.

Run::

    python benchmarks/decisions.py [--config BANK.yaml ...] [--predictor FILE] [--quick]
        [--md benchmarks/decisions.md] [--plot benchmarks/decisions.png] [--out DIR] [--metric val_loss]

Writes the markdown report, the plot and ``decisions.json`` (every replicate × setting × held-out
corpus; fields family, seed, method, setting, default, compute, regret, within_noise, best_kept).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.common.overrides import ConfigError  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from predictors import Predictor  # noqa: E402
from predictors.io import atomic_write_json, atomic_write_text  # noqa: E402
from predictors.kinds import SWEEP_KINDS  # noqa: E402
from predictors.run_keys import METRIC_COLUMNS, METRIC_WORDS  # noqa: E402
from hpo.trials.rule_replay import Point, Row, frontier  # noqa: E402
from benchmarks.decisions_replay import Bank, bank_corpus, replay_bank, with_order_error_from  # noqa: E402

#: The banks replayed by default, by corpus.
DEFAULT_BANKS = ("configs/calibration/decisions.yaml", "configs/calibration/decisions_grid.yaml",
                 "configs/calibration/decisions_large.yaml", "configs/calibration/decisions_perl.yaml",
                 "configs/calibration/decisions_cheaders.yaml")
METHODS = ("collapse", "current-best", "asha", "median", "paired-test", "top-k")
#: The kinds where curves cross (τ varies within the sweep).
CROSSING = ("batch_fixed_lambda", "lambda", "eta_fixed_lambda", "eta_lambda_grid")
WITHIN, KEPT = 0.90, 0.95


def safe(rows: Sequence[Row]) -> bool:
    """Within σ_seed on ≥ 90% and the true best kept on ≥ 95% of these replicates."""
    rows = [r for r in rows if math.isfinite(r.compute)]
    return bool(rows) and sum(bool(r.within_noise) for r in rows) >= WITHIN * len(rows) - 1e-9 and \
        sum(bool(r.best_kept) for r in rows) >= KEPT * len(rows) - 1e-9


def equal_quality(rows: Sequence[Row], method: str) -> Optional[tuple[float, str]]:
    """(least mean compute, setting) of ``method``'s settings that are :func:`safe` on ``rows``."""
    by_setting: dict[str, list[Row]] = {}
    for r in rows:
        if r.method == method:
            by_setting.setdefault(r.setting, []).append(r)
    ok = [(float(np.mean([r.compute for r in mine])), label) for label, mine in by_setting.items() if safe(mine)]
    return min(ok) if ok else None


def select_default(rows_by_corpus: dict[str, list[Row]]) -> tuple[str, str]:
    """The collapse setting chosen on these corpora (never the held-out one): the cheapest (mean
    compute over the corpora) that is :func:`safe` on each corpus; if none is, the one whose worst
    corpus keeps the best most often (then cheapest). Returns (setting, why in words)."""
    settings = sorted({r.setting for rows in rows_by_corpus.values() for r in rows if r.method == "collapse"})
    scored = []
    for label in settings:
        per = {c: [r for r in rows if r.method == "collapse" and r.setting == label]
               for c, rows in rows_by_corpus.items()}
        if any(not v for v in per.values()):
            continue
        worst_kept = min(np.mean([bool(r.best_kept) for r in v]) for v in per.values())
        worst_within = min(np.mean([bool(r.within_noise) for r in v]) for v in per.values())
        compute = float(np.mean([np.mean([r.compute for r in v]) for v in per.values()]))
        scored.append((all(safe(v) for v in per.values()), worst_kept, worst_within, compute, label))
    ok = [s for s in scored if s[0]]
    if ok:
        _, k, w, c, label = min(ok, key=lambda s: (s[3], s[4]))
        return label, f"the cheapest safe on each of {', '.join(rows_by_corpus)} (mean compute {c:.2f})"
    _, k, w, c, label = max(scored, key=lambda s: (s[1], s[2], -s[3]))
    return label, (f"no setting is safe on each of {', '.join(rows_by_corpus)}: the one whose worst corpus keeps "
                   f"the best most often ({100 * k:.0f}% kept, {100 * w:.0f}% within; mean compute {c:.2f})")


def _kind(family: str) -> str:
    return SWEEP_KINDS.get(family, family)


def _count(rows: Sequence[Row], field: str) -> str:
    return f"{sum(bool(getattr(r, field)) for r in rows)}/{len(rows)}"


def held_out_table(loco: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    """Per held-out corpus and kind: the setting chosen on the other corpora, its figures there."""
    body, verdicts = [], []
    for corpus, res in loco.items():
        rows = [r for r in res["rows"] if r.setting == res["chosen"] and r.method == "collapse"]
        for size in sorted({r.n_trials for r in rows}):
            mine = [r for r in rows if r.n_trials == size]
            cap = 0.30 if size >= 25 else 0.45
            compute = float(np.mean([r.compute for r in mine]))
            ok = safe(mine) and compute <= cap + 1e-9
            verdicts.append(("MET" if ok else "MISSED") + f": {corpus}, {size}-trial sweeps: within "
                            f"{_count(mine, 'within_noise')}, kept {_count(mine, 'best_kept')}, mean compute "
                            f"{compute:.3f} (targets ≥ 90%, ≥ 95%, ≤ {cap:.2f})")
        for family in dict.fromkeys(r.family for r in rows):
            mine = [r for r in rows if r.family == family]
            body.append([corpus, _kind(family), mine[0].n_trials, f"{np.mean([r.compute for r in mine]):.3f}",
                         _count(mine, "within_noise"), _count(mine, "best_kept")])
    return markdown_table(["held-out corpus", "kind of sweep", "trials", "mean compute", "within σ_seed",
                           "best kept"], body), verdicts


def equal_quality_table(banks: Sequence[Bank]) -> tuple[str, list[str]]:
    """Per bank and kind, each method's equal-quality compute, collapse ÷ current-best, and the
    default's compute, within and kept counts (banks replayed with their held-out predictor)."""
    body, ratios = [], []
    for b in banks:
        for family in b.meta["kinds"]:
            rows = [r for r in b.rows if r.family == family]
            cells = []
            found = {m: equal_quality(rows, m) for m in METHODS}
            for m in METHODS:
                cells.append("—" if found[m] is None else f"{found[m][0]:.2f}")
            c, cb = found["collapse"], found["current-best"]
            ratio = (c[0] / cb[0]) if c and cb else None
            if ratio is not None:
                ratios.append((family, b, ratio))
            default = [r for r in rows if r.default]
            body.append([f"{b.meta['corpus']}: `{Path(b.config).stem}`", _kind(family), *cells,
                         "—" if ratio is None else f"{ratio:.2f}×",
                         f"{np.mean([r.compute for r in default]):.2f}, {_count(default, 'within_noise')}, "
                         f"{_count(default, 'best_kept')}" if default else "—"])
    crossing = [x for x in ratios if x[0] in CROSSING and x[2] <= 0.85 + 1e-9]
    worse = [x for x in ratios if x[2] > 1.05 + 1e-9]
    no_safe = [f"{b.meta['corpus']} {f}" for b in banks for f in b.meta["kinds"]
               if equal_quality([r for r in b.rows if r.family == f], "collapse") is None]
    verdicts = [("MET" if len(crossing) >= 2 else "MISSED") + ": collapse ≤ 0.85× current-best's equal-quality "
                f"compute on ≥ 2 crossing kinds: {len(crossing)} (" + (", ".join(
                    f"{b.meta['corpus']} {f} {r:.2f}×" for f, b, r in crossing) or "none") + ")",
                ("MET" if not worse and not no_safe else "MISSED") + ": ≤ 1.05× on every kind: " + (
                    ", ".join(f"{b.meta['corpus']} {f} {r:.2f}×" for f, b, r in worse) or "none above")
                + (f"; collapse never safe on {', '.join(no_safe)}" if no_safe else "")]
    header = ["bank", "kind of sweep", *METHODS, "collapse ÷ current-best", "default: compute, within, kept"]
    return markdown_table(header, body), verdicts


def every_setting(b: Bank) -> list[str]:
    lines = [f"### `{Path(b.config).stem}` ({b.meta['corpus']}, {b.meta['n_trials']} trials, TPP {b.meta['tpp']:g}, "
             f"{b.meta['n_replicates']} replicates), held-out predictor", ""]
    for family in b.meta["kinds"]:
        pts = sorted(b.agg.get(family, []), key=lambda p: (p.method, p.compute))
        lines += [f"{_kind(family)} (σ_seed {b.sigmas.get(family) or float('nan'):.4f})", "", markdown_table(
            ["method", "setting", "mean compute", "mean regret", "within", "kept"],
            [[p.method + (" (default)" if p.default else ""), p.setting, f"{p.compute:.3f}", f"{p.regret:.4f}",
              f"{p.within}/{p.n}", "" if p.best_kept is None else f"{p.best_kept}/{p.n}"] for p in pts]), ""]
    return lines


def render(loco: dict[str, dict[str, Any]], predictor_path: str, shipped: Optional[tuple[str, str]], *,
           metric: str = "loss", predictor_metric: str = "loss") -> str:
    held, held_verdicts = held_out_table(loco)
    eq_banks = [b for res in loco.values() for b in res["banks"] if b.meta["corpus"] == res["corpus"]]
    eq, eq_verdicts = equal_quality_table(eq_banks)
    lines = ["# Decisions at equal quality, held out by corpus", "",
             "Generated by `python benchmarks/decisions.py` (its docstring defines every term). Predictor: "
             f"`{predictor_path}` (fitted on the stdlib); for each held-out corpus its order error is measured on the "
             "other corpora's banks, and the default is chosen on the other corpora only.", "",
             f"Decided on and scored by `{metric}` ({METRIC_WORDS[metric]}); the predictor was fitted on "
             f"`{predictor_metric}`" + ("" if metric == predictor_metric else " (another metric: a cross-metric "
                                        "measurement, which `hpo sweep` refuses)") + ".", "",
             "## Targets", "", *[f"- {v}" for v in held_verdicts + eq_verdicts], "",
             "## The default, chosen without the corpus it is scored on", ""]
    for corpus, res in loco.items():
        lines.append(f"- held out **{corpus}**: order error from {res['order_from'] or 'the predictor as shipped'}; "
                     f"chosen `{res['chosen']}` ({res['why']})")
    if shipped:
        lines += ["", f"Chosen on all corpora (what `SchedulerSettings()` should ship): `{shipped[0]}` ({shipped[1]})."]
    lines += ["", held, "", "## Equal-quality compute", "",
              "The least mean compute at which a method's best setting is safe (within σ_seed on ≥ 90%, true best "
              "kept on ≥ 95% of replicates), per bank and kind; — = no setting is. Each bank replayed with the "
              "predictor held out from its corpus. The last column is the shipped default, chosen on all corpora "
              "these banks included: in-sample, not a held-out figure (those are in the table above).", "", eq, "", "## Every setting", ""]
    for b in eq_banks:
        lines += every_setting(b)
    return "\n".join(lines)


def plot(loco: dict[str, dict[str, Any]], path: Path) -> None:
    """Per held-out bank and kind: each method's frontier (lowest mean regret at mean compute ≤ c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(b, f) for res in loco.values() for b in res["banks"] if b.meta["corpus"] == res["corpus"]
              for f in b.meta["kinds"]]
    cols = min(5, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.0 * rows), dpi=100, squeeze=False)
    colours = dict(zip(METHODS, ("tab:blue", "tab:red", "tab:orange", "tab:green", "tab:purple", "tab:brown")))
    grid = np.linspace(0.1, 1.0, 91)
    for ax, (b, family) in zip(axes.flat, panels):
        for method in METHODS:
            pts = [(c, frontier(b.agg[family], method, c)) for c in grid]
            pts = [(c, p.regret) for c, p in pts if p is not None]
            if pts:
                ax.step(*zip(*pts), where="post", color=colours[method], label=method, lw=1.5)
        for p in b.agg[family]:
            if p.default:
                ax.plot([p.compute], [p.regret], "o", color="black", ms=5, label="default")
        if b.sigmas.get(family):
            ax.axhline(b.sigmas[family], color="grey", ls=":", lw=1, label="σ_seed")
        ax.set_title(f"{b.meta['corpus']} {Path(b.config).stem.replace('decisions', '') or ''}: {family}", fontsize=8)
        ax.set_xlim(0.1, 1.0)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    axes[0][0].set_ylabel("mean regret (loss)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=len(unique), fontsize=8, frameon=False)
    fig.supxlabel("compute (fraction of the full sweep)", fontsize=8, y=0.04)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def leave_one_corpus_out(configs: Sequence[str], predictor: Predictor, fit_corpus: str, *, quick: bool,
                         families: Sequence[str], started: float, metric: str = "loss") -> dict[str, dict[str, Any]]:
    """For each corpus: the predictor with its order error from the other corpora (neither this
    one nor the fit's, where any such bank exists), every bank replayed with it, the default
    chosen on the other corpora's rows."""
    by_corpus: dict[str, list[str]] = {}
    for c in configs:
        by_corpus.setdefault(bank_corpus(c), []).append(c)
    out = {}
    for corpus in by_corpus:
        order_banks = [c for k, cs in by_corpus.items() if k not in (corpus, fit_corpus) for c in cs]
        held_predictor = with_order_error_from(predictor, order_banks, metric) if order_banks else predictor
        banks = [replay_bank(c, held_predictor, quick=quick, families=families, started=started, metric=metric)
                 for c in configs]
        for b in banks:
            for r in b.rows:
                r.n_trials = b.meta["n_trials"]
        others = {k: [r for b in banks if b.meta["corpus"] == k for r in b.rows] for k in by_corpus if k != corpus}
        chosen, why = select_default(others) if others else (
            next((r.setting for r in banks[0].rows if r.default), ""), "no other corpus: the shipped default")
        out[corpus] = {"corpus": corpus, "banks": banks, "chosen": chosen, "why": why,
                       "order_from": ", ".join(sorted({bank_corpus(c) for c in order_banks})),
                       "rows": [r for b in banks if b.meta["corpus"] == corpus for r in b.rows]}
        print(f"held out {corpus}: chose {chosen} ({why}) [{time.monotonic() - started:.0f} s]", flush=True)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", nargs="+", default=list(DEFAULT_BANKS), help="decision-bank calibration YAML(s)")
    p.add_argument("--predictor", default=str(Path(__file__).resolve().parents[1] / "hpo/data/predictors/default.json"),
                   help="predictor JSON (default: the shipped one)")
    p.add_argument("--fit-corpus", default="stdlib", help="the corpus the predictor was fitted on")
    p.add_argument("--out", default="runs/benchmarks/decisions", help="directory for decisions.json")
    p.add_argument("--md", default="benchmarks/decisions.md", help="markdown report path")
    p.add_argument("--plot", default="benchmarks/decisions.png", help="frontier plot path")
    p.add_argument("--quick", action="store_true", help="a few settings per method (for tests)")
    p.add_argument("--families", nargs="*", default=[], help="only these kinds of sweep")
    p.add_argument("--metric", choices=sorted(METRIC_COLUMNS), default="loss",
                   help="the loss decided on and scored (default loss, the smoothed training loss; val_loss needs "
                        "banks evaluated at every report)")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        predictor = Predictor.load(args.predictor)
        loco = leave_one_corpus_out(args.config, predictor, args.fit_corpus, quick=args.quick,
                                    families=args.families, started=started, metric=args.metric)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"decisions: {exc}", file=sys.stderr)
        return 2
    shipped = None
    if len(loco) > 1:  # the setting every corpus supports: chosen on all, reported on none
        rows_all = {k: res["rows"] for k, res in loco.items()}
        shipped = select_default(rows_all)
    text = render(loco, args.predictor, shipped, metric=args.metric, predictor_metric=predictor.metric)
    atomic_write_text(args.md, text + "\n")
    plot(loco, Path(args.plot))
    atomic_write_json(Path(args.out) / "decisions.json", {
        "rows": [{**asdict(r), "held_out_corpus": k} for k, res in loco.items() for b in res["banks"] for r in b.rows],
        "chosen": {k: res["chosen"] for k, res in loco.items()},
        "sigma_seed": {b.config: b.sigmas for res in loco.values() for b in res["banks"]}})
    print("\n".join(line for line in text.split("\n") if line.startswith("- ")))
    print(f"wrote {args.md}, {args.plot}, {Path(args.out) / 'decisions.json'} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
