"""The numbers behind the sweep report: what each selection rule picked at every rung, what
it cost, and regret vs stop fraction (no files, no rendering).

:func:`analyse` reads ``<output>/scheduler_state.json`` (and the predictor) into an
:class:`Analysis` whose :class:`Report` holds every number; :mod:`hpo.reporting.report` renders it as
CSV, markdown and terminal text and :mod:`hpo.reporting.plots` draws it. Both import this module, and
it imports neither, so the data flows one way: state → analysis → rendering.

The two selection rules of the paper (§5; see docs/paper.md):

* **predicted-best**: the trial with the lowest predicted final loss at the rung;
* **current-best**: the trial with the lowest smoothed loss at the rung.

For the rung table the picks are taken from the scheduler's decision log as recorded. The
regret of a pick is ``final loss of the pick − best final loss among all trials``. It is a
*true* regret only when every trial's final loss is known (audit mode, or a sweep in which no
trial was stopped); otherwise the report gives the final loss of the pick where it is known
and marks the regret ``n/a``. Diverged trials are never picked (and never count as "best").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from hpo.decisions.scheduler_state import RungDecision, RungRecord, SchedulerState, TrialRecord, TrialStatus
from predictors.curves import compute_fraction as weighted_compute, rung_cut
from predictors.io import finite_or_none
from predictors.predictor import Predictor
from predictors.smoothing import final_loss as smoothed_final_loss

STATE_FILE = "scheduler_state.json"
PREDICTOR_FILE = "predictor.json"
EARLY_ANSWER_FILE = "predicted_best.json"

#: The two selection rules, in table order.
RULES = ("predicted_best", "current_best")
RULE_LABELS = {"predicted_best": "predicted-best", "current_best": "current-best"}
#: Stop fractions of the regret-vs-stop-fraction curve (audit sweeps): 0.05, 0.10, …, 0.90.
STOP_GRID: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 19))

#: Columns of ``report.csv`` (one row per rung × rule).
CSV_COLUMNS = (
    "rung_index",          # position of the rung in the scheduler's list
    "rung_fraction",       # the decision fraction t̂ of the rung
    "rung_status",         # decided | provisional (reached, not decided) | not reached
    "rule",                # predicted_best | current_best
    "trial_id",            # the rule's pick (empty: nobody to pick)
    "config",              # the pick's config (the keys that vary across trials)
    "pick_source",         # decision log | recomputed from log entries | none
    "n_candidates",        # non-diverged trials judged at the rung
    "train_fraction",      # the t̂ of the point used for the pick at this rung
    "smoothed_loss",       # the pick's smoothed loss at that point
    "predicted_final_loss",  # the pick's predicted final loss at the rung
    "uncertainty",         # 1σ of predicted_final_loss
    "final_loss_of_pick",  # the pick's true final loss, where it finished
    "best_final_loss",     # best final loss among all trials (only when every final is known)
    "regret",              # final_loss_of_pick − best_final_loss (only when a true regret)
    "regret_pct",          # 100·regret/best_final_loss
    "regret_kind",         # "true regret" or "n/a: <why>"
    "compute_fraction",    # the sweep's compute fraction spent when the rung was decided
)


@dataclass
class Report:
    """Everything the report computed, plus the files it wrote.

    Attributes:
        output_dir: the sweep's output directory.
        rows: one dict per rung × rule, keys :data:`CSV_COLUMNS`.
        compute_fraction: compute used against a full sweep, Σ t̂_i·N_i·D_i / Σ N_i·D_i with t̂_i
            the furthest fraction each trial reached (equal weights without N, D); None
            without trials.
        early_answer: the early-answer dict (state, or ``predicted_best.json``), or None.
        paths: files written, by name (``csv``, ``md``, ``curves``, ``normalized``, ``regret``).
        notes: human-readable remarks (missing predictor, excluded trials, meaning of regret, …).
        regret_is_true: True when every non-diverged trial's final loss is known, so regrets
            are true regrets.
        best_trial: the trial with the best known final loss (the true best when
            ``regret_is_true``, else the best of those that finished).
        best_final_loss: that trial's final loss.
        regret_curve: audit sweeps only: one dict per stop fraction × rule (``stop_fraction``,
            ``rule``, ``trial_id``, ``value``, ``final_loss_of_pick``, ``regret``,
            ``regret_pct``, ``n_candidates``), recomputed from truncated histories.
        compute_fraction_if_stopped: audit sweeps: the compute the sweep would have used had
            it stopped trials where audit mode says it would have (``would_stop_at``).
        best_at_rungs: when the true best is known (audit sweeps): per rung, what the rung did
            to it, one dict each (``rung_fraction``, ``trial_id``, ``verdict``: ``kept``,
            ``would stop`` / ``stopped`` (here), ``out`` (at an earlier rung), ``not decided``,
            ``not reached``; ``reason``: the rung's words for it).
        status_counts: trials by status.
        early_answer_final: the early answer's final loss, once its trial finished.
        best_label: the best trial's config in words (``lr=0.005, τ=0.3``).
        compute_weighted: True when compute is weighted by N·D, False for equal weights.
    """

    output_dir: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    compute_fraction: Optional[float] = None
    early_answer: Optional[dict[str, Any]] = None
    paths: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    regret_is_true: bool = False
    best_trial: Optional[str] = None
    best_final_loss: Optional[float] = None
    regret_curve: list[dict[str, Any]] = field(default_factory=list)
    compute_fraction_if_stopped: Optional[float] = None
    best_at_rungs: list[dict[str, Any]] = field(default_factory=list)
    status_counts: dict[str, int] = field(default_factory=dict)
    compute_weighted: bool = False
    early_answer_final: Optional[float] = None
    best_label: Optional[str] = None


# ----------------------------------------------------------------------------- helpers
def is_diverged(rec: TrialRecord) -> bool:
    """A diverged trial: status ``diverged`` or a recorded divergence point."""
    return rec.status == TrialStatus.DIVERGED or rec.diverged_at is not None


def final_loss(rec: TrialRecord) -> Optional[float]:
    """The true final loss of a trial that completed (``predictors.smoothing.final_loss`` of
    its history: the smoothed loss at t̂ = 1)."""
    if rec.status != TrialStatus.COMPLETED or is_diverged(rec) or not rec.history:
        return None
    t, y = zip(*rec.history)
    return smoothed_final_loss(t, y)


def clean_history(history: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(t̂, loss) arrays of the finite, positive points with t̂ in [0, 1], strictly increasing
    (a repeated t̂ keeps the later value, a step back is dropped)."""
    ts: list[float] = []
    ys: list[float] = []
    for point in history or []:
        try:
            t, y = float(point[0]), float(point[1])
        except (TypeError, ValueError, IndexError):
            continue
        if not (math.isfinite(t) and math.isfinite(y)) or y <= 0 or not 0.0 <= t <= 1.0:
            continue
        if ts and t == ts[-1]:
            ys[-1] = y
        elif not ts or t > ts[-1]:
            ts.append(t)
            ys.append(y)
    return np.asarray(ts, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def point_index(t: np.ndarray, fraction: float) -> Optional[int]:
    """Index of the rung point of ``fraction`` (``predictors.curves.rung_cut``), or None."""
    n = rung_cut(t, fraction)
    return None if n is None else n - 1


def controls_of(rec: TrialRecord) -> Any:
    """``predictors.Controls`` of a trial, or None (no controls, or not buildable)."""
    return rec.controls


def predict(predictor: Any, t: np.ndarray, y: np.ndarray, controls: Any) -> Optional[tuple[float, float]]:
    """(final_loss, uncertainty) of ``predictor.predict_final``, or None when it cannot predict."""
    if predictor is None or controls is None or len(t) == 0:
        return None
    try:
        p = predictor.predict_final(t, y, controls)
    except Exception:  # noqa: BLE001 - too few points, bad curve, …: no prediction
        return None
    final = finite_or_none(getattr(p, "final_loss", None))
    if final is None:
        return None
    unc = finite_or_none(getattr(p, "uncertainty", None))
    return final, (unc if unc is not None else float("nan"))


def varying_keys(configs: Iterable[dict[str, Any]]) -> list[str]:
    """Config keys whose values differ across trials (all keys when none differ)."""
    configs = [c or {} for c in configs]
    keys: list[str] = []
    for c in configs:
        for k in c:
            if k not in keys:
                keys.append(k)
    varying = [k for k in keys if len({_fmt_value(c.get(k)) for c in configs}) > 1]
    return varying or keys


def config_label(config: Optional[dict[str, Any]], keys: Sequence[str], max_len: int = 80) -> str:
    """``k=v, …`` of ``config`` restricted to ``keys`` (floats to 3 significant digits)."""
    config = config or {}
    text = ", ".join(f"{k}={_fmt_value(config[k])}" for k in keys if k in config)
    return text if len(text) <= max_len else text[: max_len - 1] + "…"


def compute_fraction(
    trials: dict[str, TrialRecord], fractions: Optional[dict[str, float]] = None
) -> tuple[Optional[float], bool]:
    """Σ t̂_i·N_i·D_i / Σ N_i·D_i (``fractions`` defaults to how far each trial got).

    Returns (fraction, weighted); weighted is False when some trial lacks a positive
    ``n_params``/``total_tokens`` and equal weights were used.
    """
    if not trials:
        return None, False
    if fractions is None:
        fractions = {tid: reached_fraction(rec) for tid, rec in trials.items()}
    weights = {}
    for tid, rec in trials.items():
        n, d = finite_or_none(rec.n_params), finite_or_none(rec.total_tokens)
        weights[tid] = n * d if n is not None and d is not None and n > 0 and d > 0 else None
    weighted = all(w is not None for w in weights.values())
    return weighted_compute(fractions, weights, {t: rec.redone for t, rec in trials.items()}), weighted


def reached_fraction(rec: TrialRecord) -> float:
    """The furthest t̂ a trial reached (last reported fraction or last history point)."""
    last = rec.history[-1][0] if rec.history else 0.0
    value = max(finite_or_none(rec.last_train_fraction) or 0.0, finite_or_none(last) or 0.0)
    return 1.0 if rec.status == TrialStatus.COMPLETED and value == 0.0 and rec.final_metric is not None else value


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _order_key(trials: dict[str, TrialRecord]):
    return lambda tid: (trials[tid].order if tid in trials else 1 << 30, tid)


# ----------------------------------------------------------------------------- analysis
class Analysis:
    """The numbers behind the report (no files): :meth:`run` fills ``self.report``."""

    def __init__(self, state: SchedulerState, predictor: Any, output_dir: Path) -> None:
        self.state = state
        self.predictor = predictor
        self.report = Report(output_dir=output_dir)
        self.trials = state.trials
        self.labels_keys = varying_keys(rec.config for rec in self.ordered())
        self.finals = {tid: final_loss(rec) for tid, rec in self.trials.items()}
        self.eligible = [tid for tid in self._ordered_ids() if not is_diverged(self.trials[tid])]
        self.curves = {tid: clean_history(rec.history) for tid, rec in self.trials.items()}

    def _ordered_ids(self) -> list[str]:
        return sorted(self.trials, key=_order_key(self.trials))

    def ordered(self) -> list[TrialRecord]:
        """The trials in launch order."""
        return [self.trials[t] for t in self._ordered_ids()]

    def label(self, tid: Optional[str]) -> str:
        if tid is None or tid not in self.trials:
            return ""
        rec = self.trials[tid]
        text = config_label(rec.config, self.labels_keys)
        # τ is what the tool holds fixed or varies; show it beside the searched keys, from the
        # controls the trial reported (unless τ itself is a searched key).
        tau = rec.controls.tau if rec.controls is not None else None
        if "tau" not in self.labels_keys and isinstance(tau, (int, float)):
            text = f"{text}, τ={_fmt_value(float(tau))}" if text else f"τ={_fmt_value(float(tau))}"
        return text

    # ------------------------------------------------------------------ run
    def run(self) -> Report:
        rep = self.report
        notes = rep.notes
        for rec in self.trials.values():
            rep.status_counts[rec.status] = rep.status_counts.get(rec.status, 0) + 1

        known = {t: self.finals[t] for t in self.eligible if self.finals[t] is not None}
        rep.regret_is_true = bool(self.eligible) and len(known) == len(self.eligible)
        if known:
            rep.best_trial = min(known, key=lambda t: (known[t], _order_key(self.trials)(t)))
            rep.best_final_loss = known[rep.best_trial]

        if not self.trials:
            notes.append("The state holds no trials yet.")
        diverged = [t for t in self._ordered_ids() if is_diverged(self.trials[t])]
        if diverged:
            notes.append(f"Diverged trials, never picked and not counted as best: {', '.join(diverged)}.")
        empty = [t for t in self._ordered_ids() if len(self.curves[t][0]) == 0]
        if empty:
            notes.append(f"Trials with no (finite) history yet: {', '.join(empty)}.")
        if self.predictor is None:
            notes.append(
                "No predictor: predictions are taken from the decision log only; regret vs stop "
                "fraction (predicted-best) and the ℓ̂ overlay are skipped."
            )

        rep.rows = [row for rung in self.state.rungs for row in self.rung_rows(rung)]
        if not self.state.rungs:
            notes.append("The scheduler state lists no rungs.")
        elif not any(r.decided for r in self.state.rungs):
            notes.append(
                "No rung has been decided yet (a mid-run report, or async mode): picks are "
                "provisional, computed from the trials that have reached each rung so far."
            )

        rep.compute_fraction, rep.compute_weighted = compute_fraction(self.trials)
        if self.trials and not rep.compute_weighted:
            notes.append("Compute uses equal weights per trial (n_params/total_tokens not reported by every trial).")
        if self._is_audit():
            fr = {}
            for tid, rec in self.trials.items():
                stop = finite_or_none(rec.would_stop_at)
                fr[tid] = min(reached_fraction(rec), stop if stop is not None else 1.0)
            rep.compute_fraction_if_stopped, _ = compute_fraction(self.trials, fr)

        rep.early_answer = self._early_answer()
        if rep.early_answer and rep.best_trial is not None:
            rep.early_answer_final = known.get(str(rep.early_answer.get("trial_id")))
            rep.best_label = self.label(rep.best_trial)
        rep.regret_curve = self.regret_curve()
        rep.best_at_rungs = self.best_at_rungs()
        notes.extend(self.regret_notes())
        return rep

    def _is_audit(self) -> bool:
        if str(self.state.settings.get("decision_mode", "")) == "audit":
            return True
        return any(rec.would_stop_at is not None for rec in self.trials.values())

    def _early_answer(self) -> Optional[dict[str, Any]]:
        if self.state.early_answer:
            return dict(self.state.early_answer)
        path = self.report.output_dir / EARLY_ANSWER_FILE
        if path.exists():
            try:
                data = json.loads(path.read_text())
                return data if isinstance(data, dict) else None
            except (OSError, ValueError):
                self.report.notes.append(f"{path.name} could not be read; early answer omitted.")
        return None

    # ------------------------------------------------------------- rung table
    def rung_rows(self, rung: RungRecord) -> list[dict[str, Any]]:
        entries = rung.entries
        candidates = [
            tid for tid in sorted(entries, key=_order_key(self.trials))
            if tid in self.trials and not is_diverged(self.trials[tid]) and entries[tid].decision != RungDecision.REMOVED
        ]
        if rung.decided:
            status = "decided"
        elif entries:
            status = "provisional"
        else:
            status = "not reached"
        rows = []
        for rule in RULES:
            recorded = rung.predicted_best if rule == "predicted_best" else rung.current_best
            value_of = (
                (lambda e: e.predicted_final_loss) if rule == "predicted_best" else (lambda e: e.smoothed_loss)
            )
            if recorded is not None and recorded in self.trials and not is_diverged(self.trials[recorded]):
                pick, source = recorded, "decision log"
            else:
                scored = [(v, tid) for tid in candidates if (v := finite_or_none(value_of(entries[tid]))) is not None]
                pick = min(scored, key=lambda p: (p[0], _order_key(self.trials)(p[1])))[1] if scored else None
                source = "recomputed from log entries" if pick is not None else "none"
                if recorded is not None and recorded in self.trials and is_diverged(self.trials[recorded]):
                    self.report.notes.append(
                        f"Rung {rung.fraction:g}: the logged {RULE_LABELS[rule]} {recorded} later diverged; "
                        f"the table shows the best non-diverged trial instead ({pick or 'none'})."
                    )
            rows.append(self._row(rung, status, rule, pick, source, len(candidates)))
        return rows

    def _row(self, rung: RungRecord, status: str, rule: str, pick: Optional[str], source: str,
             n_candidates: int) -> dict[str, Any]:
        entry = rung.entries.get(pick) if pick is not None else None
        final = self.finals.get(pick) if pick is not None else None
        regret, pct, kind = self._regret(pick, final)
        return {
            "rung_index": rung.index,
            "rung_fraction": rung.fraction,
            "rung_status": status,
            "rule": rule,
            "trial_id": pick,
            "config": self.label(pick),
            "pick_source": source,
            "n_candidates": n_candidates,
            "train_fraction": entry.train_fraction if entry else None,
            "smoothed_loss": entry.smoothed_loss if entry else None,
            "predicted_final_loss": entry.predicted_final_loss if entry else None,
            "uncertainty": entry.uncertainty if entry else None,
            "final_loss_of_pick": final,
            "best_final_loss": self.report.best_final_loss if self.report.regret_is_true else None,
            "regret": regret,
            "regret_pct": pct,
            "regret_kind": kind,
            "compute_fraction": rung.compute_fraction,
        }

    def _regret(self, pick: Optional[str], final: Optional[float]) -> tuple[Optional[float], Optional[float], str]:
        rep = self.report
        if pick is None:
            return None, None, "n/a: no pick"
        if not rep.regret_is_true:
            if final is None:
                return None, None, "n/a: final of pick unknown (stopped or still running)"
            return None, None, "n/a: final of pick only (not every trial finished, best unknown)"
        if final is None:  # cannot happen when regret_is_true, kept for safety
            return None, None, "n/a: final of pick unknown"
        regret = final - rep.best_final_loss
        return regret, 100.0 * regret / rep.best_final_loss, "true regret"

    def best_at_rungs(self) -> list[dict[str, Any]]:
        """Per rung, whether the true best trial was kept or (would have been) stopped there.
        Known only when every trial's final loss is (audit sweeps); a trial stopped at one rung
        never enters the next (in audit mode neither: it would not have been there)."""
        rep = self.report
        if not rep.regret_is_true or rep.best_trial is None:
            return []
        out: list[dict[str, Any]] = []
        out_at: Optional[float] = None
        for rung in self.state.rungs:
            entry = rung.entries.get(rep.best_trial)
            if out_at is not None:
                verdict = "out"
            elif entry is None or entry.decision == RungDecision.REMOVED:
                verdict = "not reached"
            elif entry.decision.stopped or entry.decision == RungDecision.COMPLETED:
                # COMPLETED: the keep rule dropped a trial that had already finished.
                verdict = "stopped" if entry.decision == RungDecision.STOP else "would stop"
                out_at = rung.fraction
            elif entry.decision.kept:
                verdict = "kept"
            else:
                verdict = "not decided"
            out.append({"rung_fraction": rung.fraction, "trial_id": rep.best_trial, "verdict": verdict,
                        "out_at": out_at, "reason": entry.reason if entry is not None else ""})
        return out

    # ------------------------------------------------------- regret vs stop s
    def regret_curve(self) -> list[dict[str, Any]]:
        rep = self.report
        if not rep.regret_is_true or len(self.eligible) < 2:
            return []
        out = []
        for s in STOP_GRID:
            current: list[tuple[float, str]] = []
            predicted: list[tuple[float, str]] = []
            for tid in self.eligible:
                t, y = self.curves[tid]
                i = point_index(t, s)
                if i is None:
                    continue
                current.append((float(y[i]), tid))
                p = predict(self.predictor, t[: i + 1], y[: i + 1], controls_of(self.trials[tid]))
                if p is not None:
                    predicted.append((p[0], tid))
            for rule, scored in (("predicted_best", predicted), ("current_best", current)):
                if rule == "predicted_best" and self.predictor is None:
                    continue
                if scored:
                    value, pick = min(scored, key=lambda p: (p[0], _order_key(self.trials)(p[1])))
                    fin = self.finals[pick]
                    regret = fin - rep.best_final_loss
                    pct = 100.0 * regret / rep.best_final_loss
                else:
                    value = pick = fin = regret = pct = None
                out.append({
                    "stop_fraction": s, "rule": rule, "trial_id": pick, "value": value,
                    "final_loss_of_pick": fin, "regret": regret, "regret_pct": pct,
                    "n_candidates": len(scored),
                })
        return out

    def regret_notes(self) -> list[str]:
        rep = self.report
        n_elig = len(self.eligible)
        n_known = sum(1 for t in self.eligible if self.finals[t] is not None)
        if rep.regret_is_true:
            return [
                f"Regret is a true regret: every non-diverged trial ({n_elig}) ran to the end, so "
                "regret = final loss of the pick − best final loss among all trials "
                f"({rep.best_final_loss:.4f}, trial {rep.best_trial})."
            ]
        if not n_elig:
            return ["Regret is n/a: there are no non-diverged trials."]
        why = f"only {n_known} of {n_elig} non-diverged trials finished"
        return [
            "Regret is n/a: it needs every trial's final loss, but " + why + " (trials stopped "
            "early or still running). The table gives the final loss of a pick where that trial "
            "finished (\"final of pick\"); the loss a stopped trial would have reached is unknown, "
            "so the best final loss and the regret are not defined. Run the sweep in audit mode "
            "(`hpo sweep --audit`) to measure true regret."
        ]

    def regret_unavailable_reason(self) -> Optional[str]:
        """Why the regret-vs-stop-fraction curve is missing or partial, or None."""
        report = self.report
        if report.regret_curve:
            if self.predictor is None:
                return "only current-best is drawn (no predictor to recompute predicted-best)."
            return None
        if not report.regret_is_true:
            return ("regret vs stop fraction needs every trial's final loss (an audit sweep); "
                    "trials were stopped or are still running.")
        return "regret vs stop fraction needs at least two non-diverged trials."

    def divisors(self) -> dict[str, tuple[float, str]]:
        """What each trial's curve is normalised by: (its final loss, "final") when it finished,
        else (its latest predicted final loss, "predicted") when there is one."""
        out: dict[str, tuple[float, str]] = {}
        for rec in self.ordered():
            fin = self.finals.get(rec.trial_id)
            if fin is not None:
                out[rec.trial_id] = (fin, "final")
                continue
            latest = finite_or_none((rec.latest_prediction or {}).get("final_loss"))
            if latest is None and not is_diverged(rec):
                t, y = self.curves[rec.trial_id]
                p = predict(self.predictor, t, y, controls_of(rec))
                latest = p[0] if p else None
            if latest is not None:
                out[rec.trial_id] = (latest, "predicted")
        return out


def load_predictor(path: Path) -> tuple[Any, Optional[str]]:
    """The sweep's predictor from ``path``, or (None, a note saying why predictions are skipped)."""
    if not path.exists():
        return None, f"No {path.name} in the output directory: predictions skipped."
    try:
        return Predictor.load(path), None
    except Exception as exc:  # noqa: BLE001 - a report must still come out
        return None, f"{path.name} could not be loaded ({exc}); predictions skipped."


def analyse(output_dir: str | Path, *, predictor: Any = None) -> Analysis:
    """Analyse ``<output_dir>/scheduler_state.json`` (no files written).

    ``predictor`` (anything with ``predict_final`` and ``normalized_curve``) overrides
    ``<output_dir>/predictor.json``; without either, predictions come from the decision log
    only. Raises :class:`hpo.decisions.scheduler_state.StateFileError` on a missing/malformed state.
    """
    output_dir = Path(output_dir)
    state = SchedulerState.load(output_dir / STATE_FILE)
    load_note = None
    if predictor is None:
        predictor, load_note = load_predictor(output_dir / PREDICTOR_FILE)
    analysis = Analysis(state, predictor, output_dir)
    analysis.run()
    if load_note:
        analysis.report.notes.insert(0, load_note)
    return analysis
