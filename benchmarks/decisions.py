"""Decisions that pay: early-stopping methods replayed on held-out sweeps, at equal compute.

What: each held-out decision bank (every trial run to the end, at TPPs and seeds no calibration
uses; by default all three) is replayed through every method, and each method's pick is scored
against the true finals:

* ``configs/calibration/decisions.yaml``: five kinds of sweep (η at fixed τ, B at fixed τ, λ at
  fixed B and η, B at fixed λ, η at fixed λ) × 5 trials at 0.1M, TPP 40, three seeds;
* ``configs/calibration/decisions_grid.yaml``: a 25-trial η × λ grid at 0.1M, TPP 15, three seeds;
* ``configs/calibration/decisions_large.yaml``: the three crossing kinds × 5 trials at d 128 × 4
  layers (7.7× the calibrated size), TPP 3.

Methods:

* ``collapse``: ``CollapseScheduler`` (sync), knobs: the margin z (in units of the
  predictor's ranking scale), the rung set, the reduction factor. The shipped default
  (``hpo.trials.sweep_config.SchedulerSettings()``) is marked;
* ``asha``: Ray's ``ASHAScheduler`` on t̂ (``max_t`` 1), knobs: grace period, reduction factor;
* ``median``: Ray's ``MedianStoppingRule`` on t̂, knob: grace period;
* ``hyperband``: Ray's ``HyperBandScheduler`` on t̂ (``max_t`` 1), knob: reduction factor;
* ``current-best@s``: the lowest smoothed loss at the rung point of s, then only that trial
  is finished (``hpo.trials.replay.current_best_at``), knob: s.

Every Ray scheduler runs in :class:`hpo.decisions.simulator.SimulatedSweep` (Ray's own scheduler code,
two 1-CPU slots, deterministic arrival order) on the bank's results, exactly as a live sweep
reports them (``hpo.trials.replay.run_points``); ``tests/test_replay.py`` checks that the simulator
and a real Ray Tune replay make the same decisions.

Scoring (one definition each, shared with the scheduler: ``hpo.decisions.rules``):

* **compute** = Σ t̂ trained / n (1 = the full sweep; the trials of a sweep share N and D);
* **pick** = the finished trial with the lowest final loss; **regret** = its final − the best
  final of that replicate (loss units; final loss = ``predictors.smoothing.FINAL_LOSS_DEFINITION``);
* **seed noise** σ_seed = the pooled std of a configuration's final across the three
  replicates (init and data order change; within a replicate all trials share the data
  stream); a pick is "within noise" when its regret ≤ σ_seed;
* **frontier**: for each method and compute budget c, the lowest mean regret (over the
  replicates) of any of its settings whose mean compute is ≤ c; the band is the sd of that
  setting's regret across replicates.

Run::

    python benchmarks/decisions.py [--config BANK.yaml ...]
        [--predictor hpo/data/predictors/default.json] [--out runs/benchmarks/decisions]
        [--md benchmarks/decisions.md] [--plot benchmarks/decisions.png]

Writes the markdown report and the plot (no timings in either, so a rerun leaves them
unchanged), and ``decisions.json`` (every replicate × setting) under ``--out``.
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
# The replay (settings, scoring, aggregation, frontier) lives in its own module; this one
# judges and writes what it measured.
from benchmarks.decisions_replay import Bank, Point, Row, frontier, replay_bank  # noqa: E402

BUDGETS = (0.2, 0.3, 0.4)
#: The families where curves cross (τ varies within the sweep).
CROSSING = ("batch_fixed_lambda", "lambda", "eta_fixed_lambda", "eta_lambda_grid")
#: The banks replayed by default (issue 25): 5-trial sweeps at TPP 40, the 25-trial grid, and
#: the crossing kinds at 7.7x the calibrated model size.
DEFAULT_BANKS = ("configs/calibration/decisions.yaml", "configs/calibration/decisions_grid.yaml",
                 "configs/calibration/decisions_large.yaml")
METHODS = ("collapse", "asha", "median", "hyperband", "current-best")


def select_z(rows: Sequence[Row]) -> Optional[tuple[float, str]]:
    """The rule that chose the shipped ``margin_z`` (run on the audit bank, a validation bank at
    the calibrated scale, never on the held-out decision bank): with the default rungs and
    reduction factor, the smallest z whose keep set holds the true best at every rung on ≥ 95%
    of the replicates and whose pick is within seed noise on ≥ 90%."""
    from hpo.trials.sweep_config import SchedulerSettings

    default = SchedulerSettings()
    stem = f"rungs {'/'.join(f'{r:g}' for r in default.rungs)}, z "
    tail = f", rf {default.reduction_factor:g}"
    by_z: dict[float, list[Row]] = {}
    for r in rows:
        if r.method == "collapse" and r.setting.startswith(stem) and r.setting.endswith(tail):
            by_z.setdefault(float(r.setting[len(stem):-len(tail)]), []).append(r)
    for z in sorted(by_z):
        mine = by_z[z]
        kept = sum(bool(r.best_kept) for r in mine)
        within = sum(bool(r.within_noise) for r in mine)
        if kept >= 0.95 * len(mine) and within >= 0.9 * len(mine):
            compute = float(np.mean([r.compute for r in mine]))
            return z, (f"z = {z:g}: best kept {kept}/{len(mine)}, within noise {within}/{len(mine)}, "
                       f"mean compute {compute:.2f}")
    return None


def targets(agg: dict[str, list[Point]], rows: Sequence[Row], sigmas: dict[str, Optional[float]]) -> list[str]:
    """The issue's targets, each stated as met or missed with its numbers."""
    lines = []
    worst = []
    for family, points in agg.items():
        sigma = sigmas.get(family) or 0.0
        for c in BUDGETS:
            mine = frontier(points, "collapse", c)
            for other in ("asha", "current-best"):
                theirs = frontier(points, other, c)
                if mine is None or theirs is None:
                    continue
                gap = mine.regret - theirs.regret
                if gap > sigma:
                    worst.append(f"{family} at compute {c:g}: collapse {mine.regret:.4f} vs {other} "
                                 f"{theirs.regret:.4f} (σ_seed {sigma:.4f})")
    lines.append(("MET" if not worst else "MISSED") + ": collapse's frontier at or below ASHA's and current-best's "
                 "within one σ_seed at compute 0.2/0.3/0.4 on every family"
                 + ("" if not worst else "; beyond it: " + "; ".join(worst)))
    strictly = []
    for family in CROSSING:
        points = agg.get(family, [])
        below = []
        for c in BUDGETS:
            mine = frontier(points, "collapse", c)
            others = [frontier(points, m, c) for m in ("asha", "current-best")]
            others = [o for o in others if o is not None]
            if mine is not None and others and mine.regret < min(o.regret for o in others) - 1e-12:
                below.append(f"{c:g}")
        if below:
            strictly.append(f"{family} (compute {', '.join(below)})")
    lines.append(("MET" if len(strictly) >= 2 else "MISSED") + ": strictly below both on at least two of the "
                 f"families where curves cross ({', '.join(CROSSING)}): "
                 + (", ".join(strictly) if strictly else "none"))
    default = [r for r in rows if r.default]
    if default:
        within = sum(bool(r.within_noise) for r in default)
        cheap = sum(bool(r.within_noise) and r.compute <= 0.35 + 1e-9 for r in default)
        mean_compute = float(np.mean([r.compute for r in default]))
        ok = cheap >= 0.9 * len(default)
        lines.append(("MET" if ok else "MISSED") + f": the default picks within seed noise on ≥ 90% of replicates "
                     f"at ≤ 0.35 compute: {cheap}/{len(default)} replicates ({within} within noise at any "
                     f"compute; mean compute {mean_compute:.2f})")
        kept = [r for r in default if r.best_kept is not None]
        n_kept = sum(bool(r.best_kept) for r in kept)
        lines.append(("MET" if kept and n_kept >= 0.95 * len(kept) else "MISSED")
                     + f": the true best in the default's keep set at every rung in ≥ 95% of replicates: "
                     f"{n_kept}/{len(kept)}")
    return lines


def render(agg: dict[str, list[Point]], rows: Sequence[Row], sigmas: dict[str, Optional[float]],
           missing: Sequence[str], predictor_path: str, meta: dict[str, Any]) -> str:
    families = list(agg)
    lines = ["# Decisions that pay: early stopping at equal compute on held-out sweeps", "",
             "Generated by `python benchmarks/decisions.py` (see its docstring for every definition). "
             f"Bank: `{meta['bank']}` — {meta['n_replicates']} replicates ({len(meta['kinds'])} kind(s) of sweep × "
             f"{len(meta['seeds'])} seed(s), {meta['n_runs']} runs of {meta['n_trials']}-trial sweeps, TPP {meta['tpp']}, "
             "seeds and TPP not used by any calibration). "
             f"Predictor: `{predictor_path}`. Final loss: {meta['final_loss']}.", ""]
    if missing:
        lines += ["Not scored (incomplete): " + "; ".join(missing), ""]
    if meta.get("sigma_stand_in"):
        lines += ["One seed per sweep here: σ_seed of " + ", ".join(meta["sigma_stand_in"]) + " is the predictor's "
                  "measured seed noise (relative) times the kind's mean final, not measured on this bank.", ""]
    lines += ["## Targets", ""] + [f"- {t}" for t in targets(agg, rows, sigmas)] + [""]
    chosen = select_z(rows)
    lines += ["The rule that chose the shipped `margin_z` (`select_z`: with the default rungs and rf, the smallest z "
              "whose keep set holds the true best at every rung on ≥ 95% of replicates and whose pick is within "
              "seed noise on ≥ 90%), applied to this bank: " + (chosen[1] if chosen else "no z qualifies") + ".", ""]
    lines += ["## Regret at equal compute, read off each method's frontier", "",
              "Mean regret over the replicates ± sd across them (loss units), at the best setting of the method "
              "whose mean compute fits the budget; — = no setting that cheap. σ_seed: seed noise of the final loss "
              "in that family.", ""]
    header = ["kind of sweep (σ_seed)", "method", *(f"compute ≤ {c:g}" for c in BUDGETS)]
    body = []
    for family in families:
        sigma = sigmas.get(family)
        for method in METHODS:
            cells = []
            for c in BUDGETS:
                p = frontier(agg[family], method, c)
                cells.append("—" if p is None else f"{p.regret:.4f} ± {p.regret_sd:.4f} ({p.setting}; {p.compute:.2f})")
            if all(x == "—" for x in cells):
                continue
            body.append([f"{SWEEP_KINDS.get(family, family)} ({sigma:.4f})" if sigma is not None else family,
                         method, *cells])
    lines += [markdown_table(header, body), ""]
    lines += ["## The default configuration", "",
              f"The shipped scheduler settings (`hpo sweep` defaults: {_default_words()}) on every replicate.", ""]
    default_rows = [r for r in rows if r.default]
    lines.append(markdown_table(
        ["kind of sweep", "seed", "compute", "pick", "regret", "within σ_seed", "best kept at every rung"],
        [[SWEEP_KINDS.get(r.family, r.family), r.seed, f"{r.compute:.3f}", r.pick, f"{r.regret:.4f}",
          r.within_noise, r.best_kept] for r in default_rows]))
    lines += ["", "## Every setting", "",
              "Mean over replicates; within = replicates whose regret ≤ σ_seed; kept = replicates whose true best "
              "survived every decided rung (collapse only).", ""]
    for family in families:
        lines += [f"### {SWEEP_KINDS.get(family, family)}", ""]
        pts = sorted(agg[family], key=lambda p: (p.method, p.compute))
        lines.append(markdown_table(
            ["method", "setting", "mean compute", "mean regret", "sd", "within", "kept"],
            [[p.method + (" (default)" if p.default else ""), p.setting, f"{p.compute:.3f}", f"{p.regret:.4f}",
              f"{p.regret_sd:.4f}", f"{p.within}/{p.n}", "" if p.best_kept is None else f"{p.best_kept}/{p.n}"]
             for p in pts]))
        lines.append("")
    if meta.get("diagnostics"):
        lines += ["## How well the order is predicted", "",
                  "Pairs of trials of one replicate: how often the order of the predicted finals, and of the "
                  "smoothed losses at the rung point of s, is the order of the true finals; and the RMS of "
                  "their log-ratio errors (log(P_i/P_j) − log(F_i/F_j)). Predicted-best and current-best differ "
                  "exactly where these differ.", ""]
        lines.append(markdown_table(["kind of sweep", "s", "pairs", "predicted order right", "loss order right",
                                     "predicted log-ratio RMS", "loss log-ratio RMS"], meta["diagnostics"]))
        lines.append("")
    failed = sorted({f"{r.method} {r.setting}: {r.note}" for r in rows if r.note})
    if failed:
        lines += ["## Settings that could not run", ""] + [f"- {f}" for f in failed] + [""]
    return "\n".join(lines)


def plot(agg: dict[str, list[Point]], sigmas: dict[str, Optional[float]], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(agg)
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families), 3.8), dpi=110, sharey=False)
    axes = np.atleast_1d(axes)
    colours = {"collapse": "tab:blue", "asha": "tab:orange", "median": "tab:green", "hyperband": "tab:purple",
               "current-best": "tab:red"}
    grid = np.linspace(0.1, 1.0, 91)
    for ax, family in zip(axes, families):
        for method in METHODS:
            ys, lo, hi, xs = [], [], [], []
            for c in grid:
                p = frontier(agg[family], method, c)
                if p is None:
                    continue
                xs.append(c)
                ys.append(p.regret)
                lo.append(max(p.regret - p.regret_sd, 0.0))
                hi.append(p.regret + p.regret_sd)
            if xs:
                ax.step(xs, ys, where="post", color=colours[method], label=method, lw=1.6)
                ax.fill_between(xs, lo, hi, step="post", color=colours[method], alpha=0.12, lw=0)
        for p in agg[family]:
            if p.default:
                ax.plot([p.compute], [p.regret], "o", color="black", ms=6, label="default")
        sigma = sigmas.get(family)
        if sigma:
            ax.axhline(sigma, color="grey", ls=":", lw=1, label="σ_seed")
        ax.set_title(SWEEP_KINDS.get(family, family), fontsize=9)
        ax.set_xlabel("compute (fraction of the full sweep)", fontsize=8)
        ax.set_xlim(0.1, 1.0)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean regret (loss), frontier ± sd", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=len(unique), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _default_words() -> str:
    """The shipped scheduler defaults in words, read from ``SchedulerSettings`` (never retyped)."""
    from hpo.trials.sweep_config import SchedulerSettings

    d = SchedulerSettings()
    return (f"{d.mode}, rungs {'/'.join(f'{r:g}' for r in d.rungs)}, rf {d.reduction_factor:g}, "
            f"{d.margin} margin z = {d.margin_z:g}")


def issue_targets(agg: dict[str, list[Point]], rows: Sequence[Row], sigmas: dict[str, Optional[float]],
                  n_trials: int) -> list[str]:
    """Issue 25's targets on one bank, each MET or MISSED with its numbers."""
    lines = []
    default = [r for r in rows if r.default and math.isfinite(r.compute)]
    if default:
        by_kind = {f: float(np.mean([r.compute for r in default if r.family == f]))
                   for f in dict.fromkeys(r.family for r in default)}
        mean = float(np.mean([r.compute for r in default]))
        cap = 0.30 if n_trials >= 25 else 0.40
        worst = max(by_kind, key=by_kind.__getitem__)
        top = max(r.compute for r in default)
        within = sum(bool(r.within_noise) for r in default)
        lines.append(("MET" if mean <= cap + 1e-9 else "MISSED") + f": the default's mean compute ≤ {cap:.2f} "
                     f"({n_trials}-trial sweeps): {mean:.3f} (worst kind {worst}: {by_kind[worst]:.3f})")
        lines.append(("MET" if top <= 0.6 + 1e-9 else "MISSED") + f": no replicate above 0.6 compute: max {top:.3f}")
        lines.append(("MET" if within >= 0.9 * len(default) else "MISSED")
                     + f": picks within σ_seed on ≥ 90% of replicates: {within}/{len(default)}")
    for budget in (0.3, 0.4):
        worse, lower = [], []
        for family, points in agg.items():
            mine, theirs = frontier(points, "collapse", budget), frontier(points, "current-best", budget)
            if mine is None or theirs is None:
                continue
            half = (sigmas.get(family) or 0.0) / 2
            if mine.regret > theirs.regret + half + 1e-12:
                worse.append(f"{family} {mine.regret:.4f} vs {theirs.regret:.4f} (σ_seed/2 {half:.4f})")
            if family in CROSSING and mine.regret < theirs.regret - 1e-12:
                lower.append(f"{family} {mine.regret:.4f} vs {theirs.regret:.4f}")
        lines.append(("MET" if not worse else "MISSED") + f": at compute ≤ {budget:g}, collapse's regret ≤ "
                     "current-best's + σ_seed/2 on every kind" + ("" if not worse else ": " + "; ".join(worse)))
        crossing = [f for f in agg if f in CROSSING]
        need = min(2, len(crossing))
        lines.append(("MET" if len(lower) >= need and need else "MISSED") + f": at compute ≤ {budget:g}, strictly "
                     f"lower on ≥ {need} crossing kind(s) of the {len(crossing)} here: "
                     + (", ".join(lower) if lower else "none"))
    return lines


def summary_table(banks: Sequence[Bank]) -> str:
    """One line per bank: the default's compute and picks, and collapse against current-best."""
    body = []
    for b in banks:
        default = [r for r in b.rows if r.default and math.isfinite(r.compute)]
        by_kind = {f: float(np.mean([r.compute for r in default if r.family == f])) for f in b.meta["kinds"]}
        worst = max(by_kind, key=by_kind.__getitem__) if by_kind else None
        cells = []
        for budget in (0.3, 0.4):
            parts = []
            for family, points in b.agg.items():
                mine, theirs = frontier(points, "collapse", budget), frontier(points, "current-best", budget)
                if mine is not None and theirs is not None:
                    parts.append(f"{family} {mine.regret:.4f} vs {theirs.regret:.4f}")
            cells.append("; ".join(parts) or "—")
        sizes = ", ".join(f"{n / 1e6:.2g}M" for n in b.meta["n_params"])
        body.append([f"`{Path(b.config).name}` ({b.meta['n_trials']} trials, {sizes}, TPP {b.meta['tpp']:g}, "
                     f"{b.meta['n_replicates']} replicates)",
                     f"{np.mean([r.compute for r in default]):.3f} ({worst}: {by_kind.get(worst, float('nan')):.3f}); "
                     f"max {max(r.compute for r in default):.3f}" if default else "—",
                     f"{sum(bool(r.within_noise) for r in default)}/{len(default)}", *cells])
    return markdown_table(["held-out bank", "default: mean compute (worst kind); max", "picks within σ_seed",
                           "collapse vs current-best, compute ≤ 0.3", "… compute ≤ 0.4"], body)


def render_all(banks: Sequence[Bank], predictor_path: str) -> str:
    lines = ["# Decisions that pay: early stopping at equal compute on held-out sweeps", "",
             "Generated by `python benchmarks/decisions.py` (see its docstring for every definition), on "
             f"{len(banks)} held-out bank(s). Predictor: `{predictor_path}`. Scheduler defaults: {_default_words()}.",
             "", "## Summary (issue 25)", "",
             "Regret of collapse's and current-best's best setting within the compute budget (mean over "
             "replicates, loss units), per kind of sweep.", "", summary_table(banks), ""]
    for b in banks:
        lines += [f"### Targets on `{Path(b.config).name}`", ""]
        lines += [f"- {t}" for t in issue_targets(b.agg, b.rows, b.sigmas, b.meta["n_trials"])] + [""]
    for b in banks:
        section = render(b.agg, b.rows, b.sigmas, b.missing, predictor_path, b.meta).split("\n")
        section[0] = f"# Bank `{Path(b.config).name}`"
        lines += ["", *("#" + x if x.startswith("#") else x for x in section)]
    return "\n".join(lines)


def plot_all(banks: Sequence[Bank], path: Path) -> None:
    """One row of frontier panels per bank, stacked into one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    parts = []
    for i, b in enumerate(banks):
        part = path.with_name(f"{path.stem}.{i}.png")
        plot(b.agg, b.sigmas, part, title=f"{Path(b.config).name}")
        parts.append(Image.open(part).convert("RGB"))
    width = max(p.width for p in parts)
    canvas = Image.new("RGB", (width, sum(p.height for p in parts)), "white")
    y = 0
    for p in parts:
        canvas.paste(p, (0, y))
        y += p.height
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    for i in range(len(banks)):
        path.with_name(f"{path.stem}.{i}.png").unlink()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", nargs="+", default=list(DEFAULT_BANKS),
                   help="decision-bank calibration YAML(s) (default: the three held-out banks)")
    p.add_argument("--predictor", default="hpo/data/predictors/default.json", help="predictor JSON")
    p.add_argument("--out", default="runs/benchmarks/decisions", help="directory for decisions.json")
    p.add_argument("--md", default="benchmarks/decisions.md", help="markdown report path")
    p.add_argument("--plot", default="benchmarks/decisions.png", help="frontier plot path")
    p.add_argument("--quick", action="store_true", help="a few settings per method (for tests)")
    p.add_argument("--families", nargs="*", default=[], help="only these kinds of sweep")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        predictor = Predictor.load(args.predictor)
        banks = [replay_bank(c, predictor, quick=args.quick, families=args.families, started=started)
                 for c in args.config]
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"decisions: {exc}", file=sys.stderr)
        return 2
    text = render_all(banks, args.predictor)
    atomic_write_text(args.md, text + "\n")
    plot_all(banks, Path(args.plot))
    atomic_write_json(Path(args.out) / "decisions.json",
                      {"rows": [asdict(r) for b in banks for r in b.rows],
                       "sigma_seed": {b.config: b.sigmas for b in banks},
                       "missing": [m for b in banks for m in b.missing]})
    for b in banks:
        print(f"{b.config}:")
        print("\n".join("  " + t for t in issue_targets(b.agg, b.rows, b.sigmas, b.meta["n_trials"])))
    print(f"wrote {args.md}, {args.plot}, {Path(args.out) / 'decisions.json'} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
