"""Audit regret: "predicted-best" against "current-best" early selection on the audit sweeps.

What: for each audit sweep (``sweeps:`` of configs/calibration/audit.yaml) and each replicate
seed, every selection rule picks one trial from what it has seen at the stop fraction s, and
its regret is the final loss of the pick minus the best final loss of that replicate. Rules:

* ``current-best``: the lowest smoothed loss at the first point with t̂ ≥ s
  (``hpo.trials.replay.current_best_at``);
* ``predicted-best (m fitted)``: the lowest final loss predicted by the shipped predictor
  (``--predictor``, five-parameter mode) from the curve up to s, computed exactly as
  ``CollapseScheduler._predict`` does (see :func:`predict_final_at`);
* ``predicted-best (m = 0.05)``: the same with the paper's fixed m, refit here from the
  calibration bank of ``--calibration`` (same t_min, ``fit_m=False``; refit on every run so
  nothing cached can go stale);
* ``keep-set (ranking margin)``: the trials the scheduler's keep rule keeps at a last rung at
  s (``hpo.decisions.keep.evidence.keep_rule`` with the default calibrated margin, z·σ of the predictor's ranking
  scale for the sweep's kind: :func:`keep_set`, the same call ``CollapseScheduler`` makes).
  All kept trials are finished and the best is chosen, so its regret is 0 exactly when the set
  holds the true best; its size is reported too.

Why: the audit sweeps were run to the end for every trial, so the regret of any early rule is
exact; three replicate seeds give the seed band, below which a regret difference is noise.
Within a replicate all trials share a data stream, so picks are paired comparisons.

Seed band: σ_seed is the pooled within-configuration standard deviation of the final loss across
the replicate seeds (``hpo.trials.replay.seed_noise``); a difference of two finals has band √2·σ_seed.
A pick whose regret ≤ band counts as a tie ("picked the best or tied"). Regret is also given
against the seed-mean finals (mean over the replicates of each configuration), which is less
noisy (seed means and σ_seed use complete replicates only). Diverged runs stay candidates (a rule may pick one: regret ∞) but have no final for σ.

Partial banks (the audit bank fills while its sweep runs): a replicate (sweep × seed) is scored
only when every one of its runs is banked and complete; the missing runs are listed.

Run::

    python benchmarks/audit_regret.py [--config configs/calibration/audit.yaml]
        [--predictor hpo/data/predictors/default.json] [--calibration configs/calibration/default.yaml]
        [--fractions 0.1 0.2 0.3 0.5] [--out runs/benchmarks/audit_regret]

Writes ``audit_regret.md``, ``audit_regret.json`` and ``regret_vs_fraction.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration import held_out  # noqa: E402
from hpo.calibration.calibrate import CalibrationConfig, SweepRun, load_calibration_config  # noqa: E402
from hpo.trials.curve_bank import CurveBankError, bank_curves, load_bank, run_id_of  # noqa: E402
from hpo.common.overrides import ConfigError  # noqa: E402
from hpo.decisions.keep.collapse import DEFAULT_MARGIN_Z  # noqa: E402
from hpo.decisions.keep.evidence import Candidate, KeepDecision  # noqa: E402
from predictors.curves import compute_fraction  # noqa: E402
from predictors.kinds import sweep_values  # noqa: E402
from predictors.prediction import DEFAULT_MIN_POINTS, predict_at_rung  # noqa: E402
from hpo.trials.replay import current_best_at, run_points, score_pick, seed_noise, true_finals  # noqa: E402
from predictors import Controls, Predictor  # noqa: E402
from predictors.curves import rung_cut  # noqa: E402
from predictors.io import json_safe  # noqa: E402
# The results records, their summaries and the report's output live in their own module.
from benchmarks.audit_regret_report import (  # noqa: E402
    CURRENT, KEEP, PRED_FITTED, PRED_PAPER, AuditReport, Case, SweepReport, missing_summary, plot, render, summarise,
    sweep_sentence)

FRACTIONS = (0.1, 0.2, 0.3, 0.5)
#: CollapseScheduler's default ``min_points`` (points up to the rung needed to predict).
MIN_POINTS = DEFAULT_MIN_POINTS
#: A completed curve must reach this t̂ to count as complete (predictors.fit.FINAL_TOL).
COMPLETE_T = 0.99


class AuditError(Exception):
    """A one-line, user-facing error (names the file)."""


# ---------------------------------------------------------------------- layout


#: One run of an audit sweep (sweep, label, seed, run_id): ``hpo.calibration.calibrate.SweepRun``.
Trial = SweepRun


def audit_trials(config: CalibrationConfig) -> list[Trial]:
    """Every (sweep, configuration, seed) of the audit with its bank run_id."""
    return config.sweep_runs()


# ---------------------------------------------------------------------- bank views


@dataclass
class RunView:
    """What a scheduler sees of one banked run, plus its true final."""

    run_id: str
    history: list[tuple[float, float]]  # (t̂, smoothed loss), finite points, as results arrive
    controls: dict[str, Any]  # Controls.from_mapping(result).to_dict(), as the scheduler stores
    final: float  # last smoothed loss; inf for a diverged run
    status: str
    sweep_values: dict[str, Any] = field(default_factory=dict)  # predictors.kinds.sweep_values of a result


def run_views(frame: pd.DataFrame, run_ids: Sequence[str]) -> dict[str, RunView]:
    finals = true_finals(frame)
    views = {}
    for run_id in sorted(set(run_ids)):
        points = run_points(frame, run_id)  # the results a replay (or the live trainer) reports
        status = str(points[0]["status"])
        history = [(p["train_fraction"], p["loss"]) for p in points
                   if math.isfinite(p["loss"]) and not p["diverged"]]
        final = finals.get(run_id, math.inf) if status == "completed" else math.inf
        views[run_id] = RunView(run_id, history, Controls.from_mapping(points[0]).to_dict(), final, status,
                                sweep_values(points[0]))
    return views


def bank_state(frame: pd.DataFrame, trials: Sequence[Trial]) -> dict[str, str]:
    """run_id → why it cannot be scored ("not banked", "truncated at t̂=…") for the missing ones."""
    present = frame.groupby("run_id").agg(status=("status", "first"), t_max=("train_fraction", "max")) \
        if len(frame) else pd.DataFrame(columns=["status", "t_max"])
    missing: dict[str, str] = {}
    for trial in trials:
        if trial.run_id not in present.index:
            missing[trial.run_id] = "not banked"
            continue
        row = present.loc[trial.run_id]
        if row["status"] == "completed" and float(row["t_max"]) < COMPLETE_T:
            missing[trial.run_id] = f"truncated at t̂={float(row['t_max']):.2f}"
    return missing


# ---------------------------------------------------------------------- predictions


def predict_final_at(predictor: Predictor, history: Sequence[tuple[float, float]], controls: Mapping[str, Any],
                     upto: float, min_points: int = MIN_POINTS) -> Optional[float]:
    """The final loss the scheduler would predict for this trial at rung ``upto``
    (``predictors.prediction.predict_at_rungs``, the function ``CollapseScheduler`` itself uses);
    None where the scheduler would have no prediction."""
    t, y = zip(*history)
    return predict_at_rung(predictor, t, y, controls, upto, min_points).final_loss


def keep_set(predictor: Predictor, views: Mapping[str, RunView], candidates: Sequence[str], s: float,
             margin_z: float = DEFAULT_MARGIN_Z) -> KeepDecision:
    """What ``CollapseScheduler``'s keep rule keeps of ``candidates`` at a last rung at ``s``
    with the calibrated margin (the calls the scheduler makes: prediction, evidence, rule)."""
    cands = []
    for r in candidates:
        t, y = zip(*views[r].history)
        p = predict_at_rung(predictor, t, y, views[r].controls, s, MIN_POINTS)
        cands.append(Candidate(r, p.final_loss, p.loss, p.uncertainty))
    from hpo.decisions.keep import CollapseRule, TrialEvidence, gather

    ev = gather(predictor, s, [TrialEvidence(c) for c in cands], [views[r].sweep_values for r in candidates],
                [views[r].controls for r in candidates], last=True, reduction_factor=2)
    return CollapseRule(margin_z).decide(ev)


def reaches(view: RunView, fraction: float) -> bool:
    """Whether the run has a finite point at t̂ ≥ fraction (one that diverged earlier was never judged there)."""
    return bool(view.history) and rung_cut([t for t, _ in view.history], fraction) is not None


def t_at(view: RunView, fraction: float) -> float:
    """The t̂ of the rung point of ``fraction`` (``predictors.curves.rung_cut``)."""
    n = rung_cut([t for t, _ in view.history], fraction)
    assert n is not None
    return float(view.history[n - 1][0])


def fit_paper_predictor(calibration_path: str) -> tuple[Predictor, dict[str, Any]]:
    """Refit the paper's fixed-m predictor on the calibration bank (same runs and t_min as
    ``hpo.calibration.calibrate.fit_from_bank``, ``fit_m=False``). Returns it and a short description."""
    from predictors import fit

    config = _load_config(calibration_path)
    bank_path = _resolve(config.bank)
    if not bank_path.exists():
        raise AuditError(f"{bank_path}: no such calibration bank (named by {calibration_path})")
    frame = _read_bank(bank_path)
    wanted = {run_id_of(c) for c in config.runs()}
    curves = bank_curves(frame[frame["run_id"].isin(wanted)])
    if len(curves) < 3:
        raise AuditError(f"{bank_path}: only {len(curves)} completed curves of {calibration_path} to fit")
    start = time.time()
    # The keep-set uses the shipped predictor's calibrated e(s); this one needs no decision table.
    result = fit(curves, t_min=config.fit.t_min, fit_m=False, decision_fractions=(),
                 provenance={"calibration": config.name, "mode": "paper (m fixed)", "bank": str(bank_path)})
    info = {"calibration": calibration_path, "bank": str(bank_path), "n_curves": len(curves),
            "t_min": config.fit.t_min, "fit_mae": float(result.fit_mae),
            "params": result.predictor.to_dict()["params"], "fit_s": time.time() - start}
    return result.predictor, info


# ---------------------------------------------------------------------- scoring


def score_replicate(sweep: str, seed: int, trials: Sequence[Trial], frame: pd.DataFrame,
                    views: Mapping[str, RunView], seed_mean: Mapping[str, float],
                    predictors: Mapping[str, Predictor], keep_predictor: Predictor,
                    fractions: Sequence[float], band: Optional[float]) -> list[Case]:
    """Every rule at every s on one complete replicate (one run per configuration)."""
    label_of = {t.run_id: t.label for t in trials}
    finals = {t.run_id: views[t.run_id].final for t in trials}
    best_run = min(sorted(finals), key=lambda r: finals[r])
    best_mean = min(seed_mean.values()) if seed_mean else None

    def vs_mean(run: Optional[str]) -> Optional[float]:
        if run is None or best_mean is None:
            return None
        return seed_mean[label_of[run]] - best_mean

    def case(rule: str, s: float, outcome: Any, **extra: Any) -> Case:
        return Case(sweep, rule, s, seed, label_of.get(outcome.pick), outcome.pick, outcome.regret,
                    outcome.tie, vs_mean(outcome.pick), outcome.compute, len(finals), **extra)

    cases: list[Case] = []
    for s in fractions:
        candidates = [r for r in sorted(finals) if reaches(views[r], s)]
        if not candidates:  # every run diverged before s: nothing to pick from
            continue
        gone = len(finals) - len(candidates)
        note = f"{gone} run(s) diverged before s" if gone else ""
        # Stopping all but the pick at s, then finishing it: Σ t̂_i + (1 − t̂_pick), over n.
        seen_t = {r: t_at(views[r], s) for r in candidates}
        seen_t.update({r: views[r].history[-1][0] if views[r].history else 0.0
                       for r in finals if r not in seen_t})

        def compute_of(finished: Sequence[str]) -> float:
            return compute_fraction({r: (1.0 if r in finished else t) for r, t in seen_t.items()})

        # Every completed run reaches s, so the best over candidates is the replicate's best.
        outcome = current_best_at(frame, candidates, s, sweep=sweep, noise=band, finals=finals)
        cases.append(case(CURRENT, s, outcome, note=note))

        predicted: dict[str, dict[str, Optional[float]]] = {}
        for rule, predictor in predictors.items():
            preds = {r: predict_final_at(predictor, views[r].history, views[r].controls, s) for r in candidates}
            predicted[rule] = preds
            valid = [r for r in candidates if preds[r] is not None]
            pick = min(valid, key=lambda r: (preds[r], r)) if valid else None
            outcome = score_pick(sweep, f"{rule}@{s:g}", pick, finals, compute_of([pick] if pick else []), band)
            no_pred = len(candidates) - len(valid)
            cases.append(case(rule, s, outcome, note="; ".join(
                x for x in (note, f"{no_pred} without prediction" if no_pred else "") if x)))

        # Keep-set: what the scheduler's keep rule keeps at a last rung at s (a trial without a
        # prediction is kept, as the scheduler fails open); finish them all, take the best final.
        decision = keep_set(keep_predictor, views, candidates, s)
        kept = list(decision.kept)
        pick = min(kept, key=lambda r: (finals[r], r)) if kept else None
        outcome = score_pick(sweep, f"keep@{s:g}", pick, finals, compute_of(kept), band)
        cases.append(case(KEEP, s, outcome, keep_size=len(kept), best_in_keep=best_run in kept, note=note))
    return cases


def evaluate(frame: pd.DataFrame, trials: Sequence[Trial], predictors: Mapping[str, Predictor],
             keep_predictor: Predictor, fractions: Sequence[float] = FRACTIONS) -> AuditReport:
    """Score every complete replicate of every sweep; list what is missing."""
    missing_why = bank_state(frame, trials)
    scorable = [t for t in trials if t.run_id not in missing_why]
    views = run_views(frame, [t.run_id for t in scorable])
    rule_names = [CURRENT, *predictors, KEEP]
    sweeps: dict[str, SweepReport] = {}
    missing = [{"sweep": t.sweep, "label": t.label, "seed": t.seed, "run_id": t.run_id,
                "why": missing_why[t.run_id]} for t in trials if t.run_id in missing_why]
    for name in dict.fromkeys(t.sweep for t in trials):
        mine = [t for t in trials if t.sweep == name]
        labels = list(dict.fromkeys(t.label for t in mine))
        seeds = sorted({t.seed for t in mine})
        complete = [s for s in seeds if all(t.run_id not in missing_why for t in mine if t.seed == s)]
        done = [t for t in mine if t.seed in complete]
        finals = {lab: {t.seed: _finite(views[t.run_id].final) for t in done if t.label == lab} for lab in labels}
        seed_mean = {lab: float(np.mean([views[t.run_id].final for t in done if t.label == lab]))
                     for lab in labels} if complete else {}
        finite = {t.run_id: views[t.run_id].final for t in done if math.isfinite(views[t.run_id].final)}
        noise = seed_noise(frame, run_ids=list(finite), finals=finite) if finite else None
        sigma = noise.std if noise is not None else None
        band = math.sqrt(2.0) * sigma if sigma is not None else None
        report = SweepReport(name, labels, seeds, complete, finals, seed_mean, sigma, band,
                             noise.n_configs if noise is not None else 0, len(mine),
                             sum(1 for t in mine if t.run_id not in missing_why))
        for seed in complete:
            report.cases += score_replicate(name, seed, [t for t in done if t.seed == seed], frame, views,
                                            seed_mean, predictors, keep_predictor, fractions, band)
        report.cells = {rule: {f"{s:g}": summarise([c for c in report.cases if c.rule == rule and c.fraction == s])
                               for s in fractions} for rule in rule_names}
        report.sentence = sweep_sentence(report, fractions, list(predictors))
        sweeps[name] = report
    all_cases = [c for r in sweeps.values() for c in r.cases]
    overall = {rule: {f"{s:g}": summarise([c for c in all_cases if c.rule == rule and c.fraction == s])
                      for s in fractions} for rule in rule_names}
    table = keep_predictor.decision_error
    e_of_s = {f"{s:g}": (table.at(s) if table is not None else 0.0) for s in fractions}
    return AuditReport(list(fractions), rule_names, sweeps, missing, len({t.run_id for t in trials}), overall, e_of_s)


def audit_coverage(frame: pd.DataFrame, trials: Sequence[Trial], predictor: Predictor,
                   fractions: Sequence[float]) -> dict[str, dict[str, float]]:
    """Coverage of ``predictor``'s ±1σ/±2σ intervals on every completed audit run."""
    wanted = {t.run_id for t in trials}
    return held_out.stated_coverage(predictor, bank_curves(frame[frame["run_id"].isin(wanted)]), fractions)


def _finite(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------- main


def _resolve(path: str) -> Path:
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate.resolve()
    return (REPO_ROOT / candidate).resolve()  # config paths are written relative to the repo


def _load_config(path: str) -> CalibrationConfig:
    resolved = _resolve(path)
    if not resolved.exists():
        raise AuditError(f"{path}: no such config file")
    try:
        return load_calibration_config(str(resolved))
    except ConfigError as exc:
        message = str(exc)  # run-level validation errors name the run, not the file
        raise AuditError(message if path in message or str(resolved) in message else f"{path}: {message}") from None


def _read_bank(path: Path) -> pd.DataFrame:
    try:
        return load_bank(path)
    except CurveBankError as exc:
        raise AuditError(str(exc)) from None


def _load_predictor(path: str) -> Predictor:
    resolved = _resolve(path)
    if not resolved.exists():
        raise AuditError(f"{path}: no such predictor file")
    try:
        return Predictor.load(resolved)
    except ValueError as exc:
        raise AuditError(str(exc).splitlines()[0]) from None


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/calibration/audit.yaml", help="audit calibration YAML (sweeps:)")
    p.add_argument("--predictor", default="hpo/data/predictors/default.json", help="shipped predictor JSON")
    p.add_argument("--calibration", default="configs/calibration/default.yaml",
                   help="calibration whose bank the fixed-m predictor is refit on")
    p.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS), help="stop fractions s")
    p.add_argument("--out", default="runs/benchmarks/audit_regret", help="output directory")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> AuditReport:
    fractions = sorted(set(args.fractions))
    if not fractions or any(not 0.0 < s < 1.0 for s in fractions):
        raise AuditError(f"--fractions: each must be in (0, 1), got {args.fractions}")
    config = _load_config(args.config)
    if not config.sweeps:
        raise AuditError(f"{args.config}: no `sweeps:` to audit")
    bank_path = _resolve(config.bank)
    if not bank_path.exists():
        raise AuditError(f"{bank_path}: no such audit bank (run `hpo calibrate {args.config}` to fill it)")
    shipped = _load_predictor(args.predictor)  # before the refit: fail fast on a bad path
    trials = audit_trials(config)
    frame = _read_bank(bank_path)
    print(f"shipped predictor ({args.predictor}): {shipped!r}")
    paper, fit_info = fit_paper_predictor(args.calibration)
    p = fit_info["params"]
    print(f"refit m = 0.05 predictor on {fit_info['n_curves']} curves of {args.calibration} "
          f"(t_min {fit_info['t_min']:g}, {fit_info['fit_s']:.1f}s): b_const {p['b_const']:.4g}, "
          f"b_exp {p['b_exp']:.4g}, q_const {p['q_const']:.4g}, q_exp {p['q_exp']:.4g}, m {p['m']:.4g}, "
          f"fit MAE {100 * fit_info['fit_mae']:.2f}%")

    report = evaluate(frame, trials, {PRED_FITTED: shipped, PRED_PAPER: paper}, shipped, fractions)
    report.predictors = {PRED_FITTED: f"{args.predictor}: {shipped!r}",
                         PRED_PAPER: (f"refit on {fit_info['n_curves']} curves of {args.calibration}, "
                                      f"t_min {fit_info['t_min']:g}: " + ", ".join(
                                          f"{k} {v:.4g}" for k, v in p.items() if isinstance(v, float)))}
    n_missing = len({m["run_id"] for m in report.missing})
    print(f"audit bank {bank_path}: {report.n_runs - n_missing} of {report.n_runs} runs scorable")
    if report.missing:
        print(f"missing ({len(report.missing)} sweep × seed × configuration entries):\n{missing_summary(report)}")
    coverage = audit_coverage(frame, trials, shipped, fractions)
    coverage_text = ("\n\n## Coverage of the shipped predictor's stated intervals\n\n"
                     "Fraction of true finals inside predicted ± z·σ (σ as `predict_final` states it) "
                     "on the audit runs, which the predictor was not fitted on.\n\n"
                     + held_out.coverage_markdown({"audit (all runs)": coverage}) + "\n")
    text = render(report) + coverage_text
    print()
    print(render(report, with_missing=False) + coverage_text)  # the full missing list goes to the markdown only
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit_regret.md").write_text(text)
    payload = {"config": args.config, "bank": str(bank_path), "predictor": args.predictor,
               "paper_refit": fit_info, "coverage": coverage, **asdict(report)}
    (out / "audit_regret.json").write_text(json.dumps(json_safe(payload), indent=2, allow_nan=False))
    plot(report, out / "regret_vs_fraction.png")
    print(f"wrote {out / 'audit_regret.md'}, {out / 'audit_regret.json'}, {out / 'regret_vs_fraction.png'}")
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        run(parse_args(argv))
    except AuditError as exc:
        print(f"audit_regret: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
