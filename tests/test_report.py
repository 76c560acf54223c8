"""Tests of hpo.reporting.analysis / hpo.reporting.report / hpo.reporting.plots on synthetic sweep output directories.

Curve family: L_i(t̂) = F_i·ℓ(t̂; a_i) with ℓ(t̂; a) = 1 + a·(1 − t̂)², a carried in the
controls as τ. Trial "t1" has the best final loss but a steep curve, so the current-best
rule picks "t0" until t̂ ≈ 0.70, while a predictor that knows ℓ picks "t1" from the start.
Trial "t4" is better than everyone early on but diverges at t̂ = 0.26.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpo.reporting.analysis import CSV_COLUMNS, STOP_GRID, Report
from hpo.reporting.report import print_report, write_report
from hpo.decisions.scheduler_state import RungEntry, RungRecord, SchedulerState, TrialRecord

T = np.round(np.linspace(0.01, 1.0, 100), 6)
# trial id: (final loss F, curve steepness a)
TRIALS = {"t0": (3.00, 0.2), "t1": (2.90, 0.6), "t2": (3.10, 0.4), "t3": (3.05, 0.5), "t4": (2.50, 0.1)}
RUNGS = (0.1, 0.2, 0.3)
DIVERGED_AT = 0.26


def ell(t, a):
    return 1.0 + a * (1.0 - np.asarray(t, dtype=float)) ** 2


class StubPrediction:
    def __init__(self, final_loss, uncertainty):
        self.final_loss = final_loss
        self.uncertainty = uncertainty


class StubPredictor:
    """Knows the curve family exactly: divisor = mean(L/ℓ) over the last half of the history."""

    def normalized_curve(self, t_hat, controls):
        return ell(t_hat, controls.tau)

    def predict_final(self, t_hat, loss, controls):
        t, y = np.asarray(t_hat, float), np.asarray(loss, float)
        if t.size < 3:
            raise ValueError("needs at least 3 points")
        seg = t >= 0.5 * t[-1]
        return StubPrediction(float(np.mean(y[seg] / ell(t[seg], controls.tau))), 0.01)


def controls(a):
    return {"tau": a, "tokens_per_param": 20.0, "schedule": "linear", "warmup_fraction": 0.1}


def history(tid, upto=1.0):
    f, a = TRIALS[tid]
    t = T[T <= upto + 1e-9]
    return [[float(x), float(f * ell(x, a))] for x in t]


def value_at(tid, s):
    f, a = TRIALS[tid]
    t = float(T[np.searchsorted(T, s - 1e-9)])
    return t, f * float(ell(t, a))


def make_state(directory: Path, mode: str = "audit", decided: bool = True, with_rungs: bool = True,
               upto: dict | None = None, statuses: dict | None = None) -> SchedulerState:
    """Write <directory>/scheduler_state.json for the five trials (t4 always diverges)."""
    upto = upto or {}
    statuses = statuses or {}
    trials = {}
    for order, (tid, (f, a)) in enumerate(TRIALS.items()):
        rec = TrialRecord(trial_id=tid, order=order, config={"lr": 1e-3 * (order + 1), "wd": 0.1},
                          controls=controls(a), n_params=1e6, total_tokens=2e7)
        if tid == "t4":
            rec.history, rec.status, rec.diverged_at = history(tid, DIVERGED_AT - 0.01), "diverged", DIVERGED_AT
        else:
            rec.history = history(tid, upto.get(tid, 1.0))
            rec.status = statuses.get(tid, "completed")
            rec.final_metric = rec.history[-1][1] if rec.status == "completed" and rec.history else None
        rec.last_train_fraction = rec.history[-1][0] if rec.history else 0.0
        trials[tid] = rec
    rungs = []
    stub = StubPredictor()

    for i, r in enumerate(RUNGS if with_rungs else ()):
        entries = {}
        for tid, rec in trials.items():
            if not rec.history or rec.history[-1][0] < r - 1e-9:
                continue
            t, loss = value_at(tid, r)
            h = np.asarray([p for p in rec.history if p[0] <= t + 1e-12])
            pred = stub.predict_final(h[:, 0], h[:, 1], rec.controls)
            entries[tid] = RungEntry(trial_id=tid, train_fraction=t, smoothed_loss=loss,
                                     n_points=len(h), predicted_final_loss=pred.final_loss,
                                     uncertainty=pred.uncertainty,
                                     decision="continue" if decided else "pending")
        rung = RungRecord(index=i, fraction=r, decided=decided and bool(entries), entries=entries,
                          n_participants=len(entries), compute_fraction=0.1 * (i + 1) if decided else None)
        if decided and entries:
            # The log as a scheduler writes it: t4 (not yet diverged) is best on both counts at 0.1 and 0.2.
            rung.predicted_best = min(entries, key=lambda k: entries[k].predicted_final_loss)
            rung.current_best = min(entries, key=lambda k: entries[k].smoothed_loss)
        rungs.append(rung)
    state = SchedulerState(
        settings={"decision_mode": mode, "rungs": list(RUNGS), "metric": "loss"},
        trials=trials, rungs=rungs,
        early_answer={"trial_id": "t1", "config": trials["t1"].config, "predicted_final_loss": 2.9,
                      "uncertainty": 0.01, "rung": 0.3, "compute_fraction": 0.3} if decided else None,
    )
    state.save(directory / "scheduler_state.json")
    return state


def rows_by(report: Report) -> dict[tuple[float, str], dict]:
    return {(r["rung_fraction"], r["rule"]): r for r in report.rows}


def test_audit_picks_and_true_regrets(tmp_path):
    # In audit mode predicted-best picks the true best (regret 0) at every rung; current-best picks t0 (regret 0.10).
    make_state(tmp_path)
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    rows = rows_by(report)
    assert report.regret_is_true and report.best_trial == "t1"
    for r in RUNGS:
        assert rows[(r, "predicted_best")]["trial_id"] == "t1"
        assert rows[(r, "predicted_best")]["regret"] == pytest.approx(0.0, abs=1e-9)
        assert rows[(r, "current_best")]["trial_id"] == "t0"
        assert rows[(r, "current_best")]["regret"] == pytest.approx(0.10, abs=1e-9)
        assert rows[(r, "current_best")]["regret_kind"] == "true regret"
    assert rows[(0.1, "predicted_best")]["predicted_final_loss"] == pytest.approx(2.90)
    # The config column names the searched value and the τ the trial ran at.
    assert rows[(0.1, "predicted_best")]["config"] == f"lr=0.002, τ={TRIALS['t1'][1]:.3g}"


def test_audit_report_says_per_rung_whether_the_true_best_was_kept_and_explains_compute(tmp_path, capsys):
    # An audit that would have stopped the true best (t1) at rung 0.2: the report says, per rung,
    # kept / would have been stopped / out (it was only in scheduler_state.json's would_stop_at),
    # and explains the audit's two compute figures.
    state = make_state(tmp_path)
    state.rungs[1].entries["t1"].decision = "would_stop"
    state.rungs[1].entries["t1"].reason = "predicted 2.90 outside the margin"
    del state.rungs[2].entries["t1"]
    state.trials["t1"].would_stop_at = 0.2
    state.trials["t0"].would_stop_at = 0.1
    state.save(tmp_path / "scheduler_state.json")
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    assert [(b["rung_fraction"], b["verdict"]) for b in report.best_at_rungs] == [
        (0.1, "kept"), (0.2, "would stop"), (0.3, "out")]
    md = (tmp_path / "report" / "report.md").read_text()
    section = " ".join(md.split("## Was the true best kept?", 1)[1].split("\n## ", 1)[0].split())
    assert "trial t1" in section and "| 0.1 | kept |" in section
    assert "| 0.2 | **would have been stopped here** | predicted 2.90 outside the margin |" in section
    assert "| 0.3 | out since t̂ = 0.2 |" in section
    assert "Audit mode stops nothing" in md and "would_stop_at" in md
    print_report(report)
    text = " ".join(capsys.readouterr().out.split())
    assert "true best t1 (2.9000): kept at rung t̂ = 0.1; would have been stopped at t̂ = 0.2" in text
    assert "(audit: nothing stopped; stopping where it would have stopped trials: " in text
    # Without audit (stopped trials have no final) the true best is unknown: nothing is claimed.
    make_state(tmp_path / "sync", mode="sync", upto={"t0": 0.2}, statuses={"t0": "stopped"})
    assert write_report(tmp_path / "sync", predictor=StubPredictor(), plots=False).best_at_rungs == []


def test_diverged_trial_is_never_picked(tmp_path):
    # t4 is logged as best at rungs 0.1/0.2 before it diverged; the report (table and regret curve) never picks it.
    state = make_state(tmp_path)
    assert state.rungs[0].predicted_best == "t4" and state.rungs[0].current_best == "t4"
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    assert all(r["trial_id"] != "t4" for r in report.rows)
    assert all(r["trial_id"] != "t4" for r in report.regret_curve)
    assert rows_by(report)[(0.1, "predicted_best")]["pick_source"] == "recomputed from log entries"
    assert any("diverged" in n for n in report.notes)


def test_regret_vs_stop_fraction_recomputed_in_audit(tmp_path):
    # From truncated histories: predicted-best has zero regret at every s; current-best is wrong until the curves cross (~0.70).
    make_state(tmp_path)
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    curve = {(r["stop_fraction"], r["rule"]): r for r in report.regret_curve}
    assert {s for s, _ in curve} == set(STOP_GRID)
    for s in STOP_GRID:
        assert curve[(s, "predicted_best")]["regret"] == pytest.approx(0.0, abs=1e-9)
    assert curve[(0.1, "current_best")]["trial_id"] == "t0"
    assert curve[(0.1, "current_best")]["regret"] == pytest.approx(0.10, abs=1e-9)
    assert curve[(0.9, "current_best")]["regret"] == pytest.approx(0.0, abs=1e-9)


def test_files_exist_and_csv_parses(tmp_path):
    # All report files are written; report.csv parses with pandas, has the expected columns and one row per rung × rule.
    make_state(tmp_path)
    report = write_report(tmp_path, predictor=StubPredictor())
    out = tmp_path / "report"
    for name in ("report.csv", "report.md", "curves.png", "normalized.png", "regret.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    df = pd.read_csv(out / "report.csv")
    assert list(df.columns) == list(CSV_COLUMNS)
    assert len(df) == 2 * len(RUNGS)
    assert set(df["rule"]) == {"predicted_best", "current_best"}
    md = (out / "report.md").read_text()
    assert "true regret" in md and "Early answer" in md and "Compute used" in md
    assert report.paths["csv"] == out / "report.csv"


def test_stopped_sweep_reports_final_of_pick_and_na_regret(tmp_path):
    # In a sync sweep with stopped trials, regret is n/a; the survivor's final loss is reported as "final of pick".
    make_state(tmp_path, mode="sync", upto={"t0": 0.1, "t2": 0.1, "t3": 0.2},
               statuses={"t0": "stopped", "t2": "stopped", "t3": "stopped"})
    report = write_report(tmp_path, predictor=StubPredictor())
    rows = rows_by(report)
    assert not report.regret_is_true and report.regret_curve == []
    pb = rows[(0.1, "predicted_best")]
    assert pb["trial_id"] == "t1" and pb["final_loss_of_pick"] == pytest.approx(2.90)
    assert pb["regret"] is None and pb["regret_kind"].startswith("n/a: final of pick only")
    cb = rows[(0.1, "current_best")]
    assert cb["trial_id"] == "t0" and cb["final_loss_of_pick"] is None and cb["regret_kind"].startswith("n/a")
    # compute: t0, t2 to 0.1, t3 to 0.2, t1 to 1.0, t4 to 0.25 (equal N·D) → (0.1+1+0.1+0.2+0.25)/5
    assert report.compute_fraction == pytest.approx((0.1 + 1.0 + 0.1 + 0.2 + 0.25) / 5, abs=1e-6)
    assert (tmp_path / "report" / "regret.png").is_file()
    assert "n/a" in (tmp_path / "report" / "report.md").read_text()


def test_mid_run_state_without_decided_rungs(tmp_path):
    # A mid-run state (no rung decided, an empty history, no predictor.json) still produces a full report.
    make_state(tmp_path, mode="sync", decided=False, upto={"t0": 0.15, "t1": 0.12, "t2": 0.05, "t3": -1.0},
               statuses={k: "running" for k in ("t0", "t1", "t2", "t3")})
    report = write_report(tmp_path)  # no predictor.json in tmp_path
    rows = rows_by(report)
    assert rows[(0.1, "current_best")]["rung_status"] == "provisional"
    assert rows[(0.1, "current_best")]["trial_id"] == "t0"
    assert rows[(0.1, "predicted_best")]["trial_id"] == "t1"  # from the logged (pending) predictions
    assert rows[(0.3, "current_best")]["rung_status"] == "not reached"
    assert rows[(0.3, "current_best")]["trial_id"] is None
    assert report.early_answer is None and not report.regret_is_true
    assert any("predictor.json" in n for n in report.notes)
    for name in ("report.csv", "report.md", "curves.png", "normalized.png", "regret.png"):
        assert (tmp_path / "report" / name).is_file(), name


def test_state_without_rungs(tmp_path):
    # A state that lists no rungs gives an empty rung table (header-only CSV) and a note, not an error.
    make_state(tmp_path, with_rungs=False, decided=False)
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    assert report.rows == []
    assert list(pd.read_csv(tmp_path / "report" / "report.csv").columns) == list(CSV_COLUMNS)


def test_real_predictor_loaded_from_output_dir(tmp_path):
    # With a real predictors.Predictor saved as predictor.json, write_report loads it and predicted-best has zero regret.
    predictors = pytest.importorskip("predictors")
    pred = predictors.Predictor(predictors.SurrogateParams(0.5, -0.5, 1.0, 0.0))
    pred.save(tmp_path / "predictor.json")
    trials = {}
    for order, (tid, f, tau) in enumerate((("a", 3.0, 0.05), ("b", 2.9, 0.3), ("c", 3.1, 0.1))):
        c = predictors.Controls.from_mapping(controls(tau))
        y = f * pred.normalized_curve(T, c)
        trials[tid] = TrialRecord(trial_id=tid, order=order, config={"tau": tau}, controls=controls(tau),
                                  history=[[float(t), float(v)] for t, v in zip(T, y)], status="completed",
                                  final_metric=float(y[-1]), last_train_fraction=1.0)
    SchedulerState(settings={"decision_mode": "audit"}, trials=trials,
                   rungs=[RungRecord(index=0, fraction=0.2)]).save(tmp_path / "scheduler_state.json")
    report = write_report(tmp_path, plots=False)
    assert report.regret_is_true and report.best_trial == "b"
    for r in report.regret_curve:
        if r["rule"] == "predicted_best":
            assert r["trial_id"] == "b" and r["regret"] == pytest.approx(0.0, abs=1e-9)
    assert not any("predictor" in n.lower() and "skipped" in n for n in report.notes)


def test_print_report_and_cli(tmp_path, capsys):
    # print_report shows the rule table and the written paths; `hpo report <dir>` exits 0.
    make_state(tmp_path)
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    print_report(report)
    text = capsys.readouterr().out
    assert "predicted-best" in text and "current-best" in text and "report.csv" in text
    from hpo.service.cli import main

    assert main(["report", str(tmp_path)]) == 0
    assert math.isfinite(pd.read_csv(tmp_path / "report" / "report.csv")["predicted_final_loss"].iloc[0])


def test_terminal_report_reads_at_80_columns(tmp_path):
    # A log or CI terminal is 80 columns: the picks table fits, and no "key=value" piece of a
    # config is broken across lines (it wraps between pieces).
    import io

    from rich.console import Console

    make_state(tmp_path)
    report = write_report(tmp_path, predictor=StubPredictor(), plots=False)
    for row in report.rows:
        row["config"] = "lr=0.0025, weight_decay=0.3, batch_size=4096, τ=0.3"
    out = io.StringIO()
    print_report(report, Console(file=out, width=80, force_terminal=False))
    lines = out.getvalue().splitlines()
    # (file paths are printed whole, never broken, so they are left out of the width check)
    assert max(len(line) for line in lines if not line.startswith("  ")) <= 80
    table = "\n".join(lines)
    assert " regret" in table and "0.1000" in table  # the last column is not cropped
    for piece in ("lr=0.0025,", "weight_decay=0.3,", "batch_size=4096,", "τ=0.3"):
        assert piece in table
    assert "calibrated for ranking the trials of this sweep" in table


def test_report_says_when_the_early_answer_was_revised(tmp_path):
    # An early answer replaced after it was announced (a better trial kept late) says so.
    state = make_state(tmp_path)
    state.early_answer = dict(state.early_answer, revised={
        "from": "t0", "to": "t1", "at": "2026-12-05T07:00:00Z", "revisions": 1,
        "why": "trial t1 reached t̂ = 0.3 after the rung was decided (retried after an error, or resumed) and was kept"})
    state.save(tmp_path / "scheduler_state.json")
    write_report(tmp_path, predictor=StubPredictor(), plots=False)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Revised at 2026-12-05T07:00:00Z: replaces trial t0" in md and "retried after an error" in md


def test_the_terminal_says_whether_the_early_answer_was_right(tmp_path, capsys):
    # The early answer (t1) finished best of all: right. Announced on t0 instead, it missed by
    # t0's final − t1's; without audit, "best" is only among the trials that finished.
    make_state(tmp_path)
    print_report(write_report(tmp_path, predictor=StubPredictor(), plots=False))
    text = " ".join(capsys.readouterr().out.split())
    assert "the best final of every trial: the early answer was right" in text
    state = make_state(tmp_path / "wrong", mode="sync", upto={"t2": 0.2, "t3": 0.2},
                       statuses={"t2": "stopped", "t3": "stopped"})
    state.early_answer = dict(state.early_answer, trial_id="t0")
    state.save(tmp_path / "wrong" / "scheduler_state.json")
    report = write_report(tmp_path / "wrong", predictor=StubPredictor(), plots=False)
    print_report(report)
    text = " ".join(capsys.readouterr().out.split())
    missed = report.early_answer_final - report.best_final_loss
    assert missed > 0 and report.best_trial == "t1"
    assert (f"the best of the trials that finished is t1 (lr=0.002, τ=" in text
            and f"the early answer missed by {missed:.4f}" in text)
