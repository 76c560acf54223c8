"""Tests of ``hpo.decisions.scheduler.CollapseScheduler``.

Unit tests drive the scheduler the way Ray's own scheduler tests do: stub ``Trial`` objects
and a small fake controller that mimics what ``TuneController`` (Ray 2.60) does with the
scheduler's decisions (checked against ``ray/tune/execution/tune_controller.py``):

* ``stop_trial``: PENDING/PAUSED → ``on_trial_remove``; RUNNING → ``on_trial_complete`` with
  the last result; then status TERMINATED.
* PAUSE → status PAUSED; resuming only via ``choose_trial_to_run``; PENDING trials are also
  started by the controller itself.
* a result with ``done=True`` never reaches ``on_trial_result``: STOP + ``on_trial_complete``.

Curves are synthetic: loss(t̂) = L·(1 + τ·(1 − t̂)), and the fake predictor inverts exactly
that, so the predicted final loss of a trial is its L, while its current loss also depends
on τ (so "current best" and "predicted best" differ).
"""

from __future__ import annotations

import json
import logging
import pickle
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from hpo.decisions.keep.collapse import DEFAULT_MARGIN_Z
from hpo.trials.sweep_config import SchedulerSettings
from hpo.decisions.scheduler import CollapseScheduler
from hpo.decisions.scheduler_state import SchedulerState, StateFileError

CONTINUE, PAUSE, STOP = TrialScheduler.CONTINUE, TrialScheduler.PAUSE, TrialScheduler.STOP
DT = 0.05  # report interval in t̂


@dataclass(frozen=True)
class FakePrediction:
    final_loss: float
    uncertainty: float
    stop_fraction: float = 0.0
    segment_start: float = 0.0
    n_points: int = 0
    residual: float = 0.0


class FakePredictor:
    """Inverts the synthetic curve: final = loss(t̂)/(1 + τ(1 − t̂)); σ fixed or per-τ."""

    def __init__(self, sigma: float = 0.01, fail_for_tau: Optional[float] = None) -> None:
        self.sigma = sigma
        self.fail_for_tau = fail_for_tau
        self.calls = 0

    def predict_final(self, t_hat: np.ndarray, loss: np.ndarray, controls: Any) -> FakePrediction:
        self.calls += 1
        if self.fail_for_tau is not None and controls.tau == self.fail_for_tau:
            raise RuntimeError("cannot align this curve")
        t = float(t_hat[-1])
        final = float(loss[-1]) / (1.0 + controls.tau * (1.0 - t))
        return FakePrediction(final, self.sigma, stop_fraction=t, n_points=len(t_hat))


def curve(final: float, tau: float, t: float) -> float:
    return final * (1.0 + tau * (1.0 - t))


def make_result(final: float, tau: float, t: float, **extra: Any) -> dict[str, Any]:
    return {
        "loss": curve(final, tau, t), "train_fraction": t, "tau": tau, "tokens_per_param": 20.0,
        "schedule": "linear", "warmup_fraction": 0.1, "training_iteration": int(round(t / DT)),
        **extra,
    }


def stub(tid: str, **config: Any) -> Trial:
    return Trial("__fake", trial_id=tid, stub=True, config=dict(config))


class FakeController:
    """The parts of ``TuneController`` a scheduler sees, plus a tiny event loop.

    Each trial is given by its config ``final`` (true final loss) and ``tau``.
    """

    def __init__(self, scheduler: CollapseScheduler, trials: list[Trial]) -> None:
        self.sched = scheduler
        self.trials = list(trials)
        self.last_result: dict[str, dict] = {}
        self.pos: dict[str, int] = {t.trial_id: 0 for t in self.trials}
        self.stop_calls: list[str] = []
        self.decisions: list[tuple[str, float, str]] = []
        self.chosen_paused: list[str] = []
        for t in self.trials:
            scheduler.on_trial_add(self, t)

    # --- the controller API the scheduler may use (whitelisted in TrialRunnerWrapper)
    def get_trials(self) -> list[Trial]:
        return self.trials

    def get_live_trials(self) -> set:
        return {t for t in self.trials if t.status != Trial.TERMINATED}

    def stop_trial(self, trial: Trial) -> None:
        self.stop_calls.append(trial.trial_id)
        if trial.status in (Trial.ERROR, Trial.TERMINATED):
            return
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.sched.on_trial_remove(self, trial)
        else:
            self.sched.on_trial_complete(self, trial, self.last_result.get(trial.trial_id, {}))
        trial.temporary_state.saving_to = None
        trial.set_status(Trial.TERMINATED)

    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        trial.set_status(Trial.PAUSED)

    # --- test helpers
    def add(self, trial: Trial) -> None:
        self.trials.append(trial)
        self.pos[trial.trial_id] = 0
        self.sched.on_trial_add(self, trial)

    def step(self, trial: Trial, *, error: bool = False, **extra: Any) -> Optional[str]:
        """Deliver the trial's next result (as the controller would) and apply the decision."""
        self.pos[trial.trial_id] += 1
        t = round(self.pos[trial.trial_id] * DT, 10)
        result = make_result(trial.config["final"], trial.config["tau"], t, **extra)
        if error:
            self.sched.on_trial_error(self, trial)
            trial.set_status(Trial.ERROR)
            return None
        if t >= 1.0 - 1e-9 or result.get("done"):
            result["done"] = True
            self.last_result[trial.trial_id] = result
            self.sched.on_trial_complete(self, trial, result)
            trial.set_status(Trial.TERMINATED)
            return "DONE"
        decision = self.sched.on_trial_result(self, trial, result)
        self.last_result[trial.trial_id] = result
        self.decisions.append((trial.trial_id, t, decision))
        if decision == PAUSE:
            self.pause_trial(trial)
        elif decision == STOP:
            self.stop_trial(trial)
        return decision

    def start(self, trial: Trial) -> None:
        trial.set_status(Trial.RUNNING)

    def run(self, workers: int = 2, rng: Optional[random.Random] = None, max_events: int = 20000,
            errors: Optional[dict[str, float]] = None) -> None:
        """Run to the end with ``workers`` slots; ``rng`` picks which running trial reports next."""
        errors = dict(errors or {})
        running: list[Trial] = [t for t in self.trials if t.status == Trial.RUNNING]
        for _ in range(max_events):
            while len(running) < workers:
                chosen = self.sched.choose_trial_to_run(self)
                if chosen is not None:
                    self.check_choice(chosen)
                    if chosen.status == Trial.PAUSED:
                        self.chosen_paused.append(chosen.trial_id)
                else:  # the controller starts PENDING trials on its own, too
                    chosen = next((t for t in self.trials if t.status == Trial.PENDING), None)
                if chosen is None:
                    break
                self.start(chosen)
                running.append(chosen)
            if not running:
                break
            trial = running.pop(rng.randrange(len(running)) if rng else 0)
            next_t = round((self.pos[trial.trial_id] + 1) * DT, 10)
            err = trial.trial_id in errors and next_t >= errors[trial.trial_id] - 1e-9
            if err:
                errors.pop(trial.trial_id)
            decision = self.step(trial, error=err)
            if decision == CONTINUE and trial.status == Trial.RUNNING:
                running.append(trial)
            running = [t for t in running if t.status == Trial.RUNNING]
        stuck = [t.trial_id for t in self.trials if t.status in (Trial.PAUSED, Trial.PENDING)]
        assert not stuck, f"deadlock: {stuck} never resumed\n{self.sched.debug_string()}"

    def check_choice(self, chosen: Trial) -> None:
        """choose_trial_to_run returns PENDING trials, or PAUSED ones whose rung is decided."""
        assert chosen.status in (Trial.PENDING, Trial.PAUSED)
        if chosen.status == Trial.PAUSED:
            rec = self.sched.state.trials[chosen.trial_id]
            for rung in self.sched.state.rungs:
                entry = rung.entries.get(chosen.trial_id)
                assert not (entry and entry.decision == "pending"), (
                    f"{chosen.trial_id} chosen while waiting at undecided rung {rung.fraction}")
            assert rec.status not in ("stopped", "diverged")


# Six trials: true finals (the predicted finals) and τ chosen so that the current loss at
# t̂ = 0.1 ranks them differently (t3, the true best, has the highest current loss).
SIX = {"t0": (1.30, 0.2), "t1": (1.10, 0.6), "t2": (1.50, 0.1),
       "t3": (1.00, 1.5), "t4": (1.20, 0.3), "t5": (1.40, 0.2)}


def six_trials(spec: dict = SIX) -> list[Trial]:
    return [stub(tid, final=f, tau=tau) for tid, (f, tau) in spec.items()]


SCHEDULER_KEYWORDS = ("predictor", "rule", "state_path", "resume", "on_early_answer", "on_decision", "time_attr",
                      "persist_interval_s")


def sched(**kw: Any) -> CollapseScheduler:
    """A scheduler on fake predictors: the keywords CollapseScheduler takes go to it, the rest
    into its ``SchedulerSettings``; tests of the margin's mechanics pass ``margin_z=1.0`` so the
    margin equals the stated ranking scale."""
    args = {key: kw.pop(key) for key in SCHEDULER_KEYWORDS if key in kw}
    args.setdefault("predictor", FakePredictor())
    if isinstance(args.get("rule"), (str, dict)):
        kw["rule"] = args.pop("rule")
    kw.setdefault("min_points", 2)
    kw.setdefault("rungs", (0.1, 0.2, 0.3))  # the mechanics of three rungs (the shipped default has one)
    if "decision_mode" in kw:
        kw["mode"] = kw.pop("decision_mode")
    s = CollapseScheduler(settings=SchedulerSettings(**kw), **args)
    s._strict = True  # re-raise internal errors in tests instead of logging them
    return s


def outcome(s: CollapseScheduler) -> dict[str, Any]:
    return {tid: (rec.status, rec.stopped_at) for tid, rec in s.state.trials.items()}


# ---------------------------------------------------------------------------- sync


# Asserts: sync, 6 trials, rf=2: 3 kept at 0.1, 2 at 0.2, 1 at 0.3 — exactly the predicted best.
def test_sync_six_trials_halving(tmp_path):
    answers: list[dict] = []
    s = sched(state_path=tmp_path / "scheduler_state.json", on_early_answer=answers.append)
    ctl = FakeController(s, six_trials())
    ctl.run(workers=2)
    assert outcome(s) == {
        "t0": ("stopped", 0.1), "t2": ("stopped", 0.1), "t5": ("stopped", 0.1),
        "t4": ("stopped", 0.2), "t1": ("stopped", 0.3), "t3": ("completed", None),
    }
    assert [r.survivors for r in s.state.rungs] == [["t1", "t3", "t4"], ["t1", "t3"], ["t3"]]
    assert len(answers) == 1 and answers[0]["trial_id"] == "t3"
    assert answers[0]["predicted_final_loss"] == pytest.approx(1.0)
    assert answers[0]["config"] == {"final": 1.0, "tau": 1.5}
    # compute: 3 trials stopped at 0.1, 1 at 0.2, 2 at 0.3 when the last rung is decided
    assert answers[0]["compute_fraction"] == pytest.approx((3 * 0.1 + 0.2 + 2 * 0.3) / 6)
    assert answers[0]["rung"] == 0.3 and answers[0]["margin"] == 0.0
    assert s.state.trials["t3"].final_metric == pytest.approx(1.0)
    # the stopped trials never ran past their rung
    assert {tid: rec.last_train_fraction for tid, rec in s.state.trials.items()} == pytest.approx(
        {"t0": 0.1, "t2": 0.1, "t5": 0.1, "t4": 0.2, "t1": 0.3, "t3": 1.0})
    assert s.trial_verdict("t4") == "stopped_at_0.2" and s.trial_verdict("t3") == "completed"


class BatchPredictor(FakePredictor):
    """A FakePredictor that also predicts many runs in one call, and counts those calls."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def predict_finals(self, t_hat, loss, controls, calibrated_error: bool = True):  # noqa: ANN001
        self.batches.append(len(t_hat))
        return [self.predict_final(np.asarray(t), np.asarray(y), c) for t, y, c in zip(t_hat, loss, controls)]


# Asserts: in sync mode a trial waiting at a rung shows the loss it reached it at, and every
# waiting trial is predicted when the rung is decided, in one batched call of the predictor
# (what keeps a 10,000-trial rung round to one vectorised pass); the decisions are those of
# predicting each trial on arrival (the halving test's).
def test_sync_rung_predicts_its_waiting_trials_in_one_batch(tmp_path):
    predictor = BatchPredictor()
    s = sched(predictor=predictor)
    trials = six_trials()
    ctl = FakeController(s, trials)
    ctl.start(trials[0])
    ctl.step(trials[0])
    ctl.step(trials[0])  # t̂ 0.1: waits at the first rung
    entry = s.state.rungs[0].entries[trials[0].trial_id]
    assert entry.waiting and entry.predicted_final_loss is None and entry.train_fraction == pytest.approx(0.1)
    assert entry.smoothed_loss == pytest.approx(curve(trials[0].config["final"], trials[0].config["tau"], 0.1))
    assert predictor.batches == [] and predictor.calls == 0
    ctl.run(workers=2)
    assert [r.survivors for r in s.state.rungs] == [["t1", "t3", "t4"], ["t1", "t3"], ["t3"]]
    # Rung 0.1: the six predicted together (at half of it each has one report, too few to
    # predict: no call); then the three survivors at 0.2 and the two at 0.3. No run alone.
    assert predictor.batches == [6, 3, 2] and predictor.calls == 11
    assert all(e.predicted_final_loss is not None for r in s.state.rungs for e in r.entries.values())


# Asserts: the rung log holds loss, t̂ used, prediction ± σ, decision, reason, best ids, compute.
def test_sync_decision_log(tmp_path):
    path = tmp_path / "scheduler_state.json"
    s = sched(state_path=path)
    FakeController(s, six_trials()).run(workers=2)
    rung0 = s.state.rungs[0]
    assert rung0.decided and rung0.n_participants == 6 and rung0.n_keep == 3
    assert rung0.predicted_best == "t3"
    assert rung0.current_best == "t4"  # lowest loss at t̂ = 0.1, but not the predicted best
    assert rung0.compute_fraction == pytest.approx(0.1)
    e = rung0.entries["t4"]
    assert e.train_fraction == pytest.approx(0.1) and e.n_points == 2
    assert e.smoothed_loss == pytest.approx(curve(1.2, 0.3, 0.1))
    assert e.predicted_final_loss == pytest.approx(1.2) and e.uncertainty == pytest.approx(0.01)
    assert e.decision == "continue" and e.reason == "predicted 1.2000±0.0100 is 3 of 6; keeping the top 3"
    assert rung0.entries["t0"].decision == "stop"
    assert "is 4 of 6, 26.24% above the best: beyond the margin 0.00%" in rung0.entries["t0"].reason
    assert s.state.rungs[2].entries["t3"].decision == "keep"
    assert s.state.rungs[2].entries["t1"].decision == "stop"
    # persisted: the snapshot holds the decisions, the append-only log the curves, and loading
    # both gives back the live state
    on_disk = json.loads(path.read_text())
    assert on_disk["rungs"][1]["survivors"] == ["t1", "t3"]
    assert on_disk["trials"]["t3"]["status"] == "completed" and "history" not in on_disk["trials"]["t3"]
    assert on_disk["early_answer"]["trial_id"] == "t3"
    loaded = SchedulerState.load(path)
    assert loaded.trials["t3"].history == s.state.trials["t3"].history
    assert loaded.trials["t3"].history[-1] == [1.0, pytest.approx(1.0)]


# Asserts: with 16 trials, 2 workers and random interleaving, sync keeps 8 → 4 → 1, never deadlocks.
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sync_many_trials_two_workers(seed):
    rng = random.Random(seed)
    spec = {f"x{i:02d}": (1.0 + rng.random(), rng.choice([0.2, 0.5, 1.0])) for i in range(16)}
    s = sched()
    ctl = FakeController(s, six_trials(spec))
    ctl.run(workers=2, rng=rng)
    ranked = sorted(spec, key=lambda k: spec[k][0])
    assert [len(r.survivors) for r in s.state.rungs] == [8, 4, 1]
    assert set(s.state.rungs[0].survivors) == set(ranked[:8])
    assert set(s.state.rungs[1].survivors) == set(ranked[:4])
    assert [t for t, rec in s.state.trials.items() if rec.status == "completed"] == [ranked[0]]
    # nothing wasted: each trial ran exactly to the rung it was stopped at
    for tid, rec in s.state.trials.items():
        assert rec.last_train_fraction == pytest.approx(rec.stopped_at or 1.0)
    assert ctl.chosen_paused  # survivors were resumed through choose_trial_to_run


# Asserts: choose_trial_to_run returns PENDING first and never a trial waiting at an undecided rung.
def test_choose_trial_to_run_pending_first_never_waiting():
    s = sched()
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5), stub("c", final=1.1, tau=0.5)]
    ctl = FakeController(s, trials)
    a, b, c = trials
    ctl.start(a)
    assert ctl.step(a) == CONTINUE and ctl.step(a) == PAUSE  # a waits at 0.1
    assert s.choose_trial_to_run(ctl) is b  # PENDING first
    ctl.start(b)
    ctl.start(c)
    assert s.choose_trial_to_run(ctl) is None  # a is PAUSED at an undecided rung
    ctl.step(b)
    assert ctl.step(b) == PAUSE
    assert s.choose_trial_to_run(ctl) is None
    ctl.step(c)
    assert ctl.step(c) == CONTINUE  # c decides the rung (keeps a and c) and survives
    assert b.status == Trial.TERMINATED and ctl.stop_calls == ["b"]
    assert s.choose_trial_to_run(ctl) is a  # a survived: now it may resume
    assert s.state.trials["b"].stopped_at == 0.1


# Asserts: PENDING trials are returned before PAUSED survivors; stopped PENDING trials are skipped.
def test_pending_before_paused_survivor():
    s = sched(rungs=(0.1, 0.5))
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5)
    ctl = FakeController(s, [a, b])
    for t in (a, b):
        ctl.start(t)
        ctl.step(t)
    ctl.step(a)
    assert ctl.step(b) == STOP  # b decides rung 0.1 (2 trials → keep 1: a) and loses
    assert s.state.rungs[0].survivors == ["a"]
    late = stub("late", final=1.1, tau=0.5)
    ctl.add(late)
    assert s.choose_trial_to_run(ctl) is late
    s.state.trials["late"].status = "stopped"  # e.g. known stopped after a restore
    assert s.choose_trial_to_run(ctl) is a


# Asserts: exact ties at the last rung keep exactly one: lower loss at the rung wins, then trial id.
def test_ties_broken_by_current_loss_then_id():
    s = sched(rungs=(0.1,))
    # same predicted final 1.0; "b" has the lower current loss (smaller τ)
    trials = [stub("a", final=1.0, tau=0.8), stub("b", final=1.0, tau=0.4), stub("c", final=1.3, tau=0.4)]
    FakeController(s, trials).run(workers=2)
    assert s.state.rungs[0].survivors == ["b"]
    assert "is 2 of 3" in s.state.rungs[0].entries["a"].reason
    s2 = sched(rungs=(0.1,))
    FakeController(s2, [stub("z", final=1.0, tau=0.4), stub("y", final=1.0, tau=0.4)]).run(workers=2)
    assert s2.state.rungs[0].survivors == ["y"]  # identical: trial id decides


# Asserts: ties at an intermediate rung are broken the same way, so exactly ⌈n/rf⌉ continue.
def test_tie_at_intermediate_rung_keeps_exact_count():
    s = sched(rungs=(0.1, 0.2))
    trials = [stub(t, final=1.0, tau=0.5) for t in ("d", "c", "b", "a")]
    FakeController(s, trials).run(workers=2)
    assert sorted(s.state.rungs[0].survivors) == ["a", "b"]
    assert s.state.rungs[1].survivors == ["a"]


# Asserts: a fixed margin (log units) keeps near-ties at the last rung, not the others.
def test_fixed_margin_keeps_near_ties():
    s = sched(rungs=(0.1,), margin=0.03)
    trials = [stub("a", final=1.00, tau=0.5), stub("b", final=1.02, tau=0.5), stub("c", final=1.05, tau=0.5)]
    FakeController(s, trials).run(workers=2)
    # log(1.02) = 1.98% ≤ 3%: b kept; log(1.05) = 4.88%: c stopped
    assert outcome(s) == {"a": ("completed", None), "b": ("completed", None), "c": ("stopped", 0.1)}
    assert "within the margin 3.00%" in s.state.rungs[0].entries["b"].reason
    assert s.state.early_answer["trial_id"] == "a" and s.state.early_answer["kept"] == ["a", "b"]
    with pytest.raises(ValueError, match="margin"):
        SchedulerSettings(margin=-0.1)


class RankedFakePredictor(FakePredictor):
    """A FakePredictor stating a ranking scale per rung, as ``Predictor.ranking_scale``; it
    records the sweep kinds it was asked about."""

    def __init__(self, scale: dict[float, float], **kw: Any) -> None:
        super().__init__(**kw)
        self.scale = scale
        self.kinds: list[str] = []

    def ranking_scale(self, stop_fraction: float, kind: str, controls: Any = ()) -> tuple[float, str]:
        self.kinds.append(kind)
        return self.scale[min(self.scale, key=lambda f: abs(f - stop_fraction))], f"{kind} sweeps (test table)"


# Asserts: the default calibrated margin keeps every trial within z·σ (the ranking scale at
# the rung) of the predicted best besides the rule's survivors, stops the rest, and the early
# answer states the margin and the probability that its pick is the best.
def test_calibrated_margin_keeps_trials_within_the_ranking_scale():
    answers: list[dict] = []
    s = sched(margin_z=1.0, rungs=(0.1, 0.2), predictor=RankedFakePredictor({0.1: 0.05, 0.2: 0.015}),
              on_early_answer=answers.append)
    trials = [stub("a", final=1.00, tau=0.5), stub("b", final=1.01, tau=0.5), stub("c", final=1.04, tau=0.5),
              stub("d", final=1.30, tau=0.5), stub("e", final=1.40, tau=0.5)]
    FakeController(s, trials).run(workers=2)
    # rung 0.1: top ⌈5/2⌉ = a, b, c; nothing else within 5% of a.
    assert s.state.rungs[0].survivors == ["a", "b", "c"]
    assert s.state.rungs[0].margin == pytest.approx(0.05)
    # rung 0.2 (last): b is 1% worse, within 1.5% → kept; c (3.9% in log) stopped.
    assert s.state.rungs[1].survivors == ["a", "b"]
    assert "within the margin 1.50%" in s.state.rungs[1].entries["b"].reason
    assert outcome(s)["c"] == ("stopped", 0.2)
    answer = answers[0]
    assert answer["trial_id"] == "a" and answer["margin"] == pytest.approx(0.015)
    assert "ranking scale 1.50%" in answer["margin_text"] and "test table" in answer["margin_text"]
    # a vs b is 1% apart under a pair scale of 1.5%: a is likelier the best, but far from sure
    assert 0.5 < answer["probability_best"] < 0.85
    assert s.state.settings["margin"] == "calibrated"


# Asserts: a rung whose margin exceeds the spread of the predicted finals keeps everyone and
# says so, at an intermediate rung too.
def test_calibrated_margin_keeps_everyone_when_it_exceeds_the_spread():
    s = sched(margin_z=1.0, rungs=(0.1, 0.2), predictor=RankedFakePredictor({0.1: 0.05, 0.2: 0.001}))
    trials = [stub(t, final=f, tau=0.5) for t, f in (("a", 1.00), ("b", 1.02), ("c", 1.03), ("d", 1.04))]
    FakeController(s, trials).run(workers=2)
    first = s.state.rungs[0]
    assert first.kept_all and first.survivors == ["a", "b", "c", "d"]
    assert all("keeping everyone" in e.reason for e in first.entries.values())
    assert s.state.rungs[1].survivors == ["a"] and not s.state.rungs[1].kept_all


# Asserts: margin_z scales the calibrated margin (0 turns it off); a predictor that states no
# ranking error gives margin 0; a bad margin word is refused.
def test_margin_z_and_a_predictor_without_ranking_error():
    trials = [stub("a", final=1.00, tau=0.5), stub("b", final=1.01, tau=0.5)]
    s = sched(rungs=(0.1,), predictor=RankedFakePredictor({0.1: 0.02}), margin_z=0.0)
    FakeController(s, trials).run(workers=2)
    assert s.state.rungs[0].survivors == ["a"]
    s = sched(rungs=(0.1,), predictor=RankedFakePredictor({0.1: 0.02}), margin_z=0.4)
    FakeController(s, [stub("a", final=1.00, tau=0.5), stub("b", final=1.01, tau=0.5)]).run(workers=2)
    assert s.state.rungs[0].survivors == ["a"]  # 0.995% > 0.4·2% = 0.8%
    s = sched(rungs=(0.1,), predictor=FakePredictor())
    FakeController(s, [stub("a", final=1.00, tau=0.5), stub("b", final=1.001, tau=0.5)]).run(workers=2)
    assert s.state.rungs[0].margin == 0.0 and s.state.rungs[0].survivors == ["a"]
    with pytest.raises(ValueError, match="margin"):
        SchedulerSettings(margin="wide")
    # The default z is the decision core's (one home), and the sweep config's default too.
    s = sched(rungs=(0.1,), predictor=RankedFakePredictor({0.1: 0.02}))
    FakeController(s, [stub("a", final=1.00, tau=0.5), stub("b", final=1.01, tau=0.5)]).run(workers=2)
    assert s.state.rungs[0].margin == pytest.approx(DEFAULT_MARGIN_Z * 0.02)
    assert SchedulerSettings().rule["margin_z"] == DEFAULT_MARGIN_Z


# Asserts: the margin comes from the kind of sweep the trials form, read from their configs
# (η varies at one τ: "eta_fixed_tau"; B varies at one λ: "batch_fixed_lambda").
@pytest.mark.parametrize("configs, kind", [
    ([{"lr": 0.01, "batch_size": 2048}, {"lr": 0.02, "batch_size": 2048}], "eta_fixed_tau"),
    ([{"lr": 0.01, "batch_size": 1024, "weight_decay": 0.1}, {"lr": 0.01, "batch_size": 2048, "weight_decay": 0.1}],
     "batch_fixed_lambda"),
])
def test_margin_follows_the_kind_of_sweep(configs, kind):
    predictor = RankedFakePredictor({0.1: 0.02})
    s = sched(rungs=(0.1,), predictor=predictor)
    taus = [0.5, 0.5] if kind == "eta_fixed_tau" else [0.25, 0.5]
    trials = [stub(f"x{i}", final=1.0 + 0.1 * i, tau=tau, **cfg) for i, (cfg, tau) in enumerate(zip(configs, taus))]
    FakeController(s, trials).run(workers=2)
    assert s.state.rungs[0].kind == kind
    assert kind in predictor.kinds and kind in s.state.rungs[0].margin_source


class CrossScaleFakePredictor(FakePredictor):
    """A fake whose ranking scale comes from a real ``Predictor`` calibrated at ``calibrated_tpp``
    with an in-scale and a cross-scale ranking error (scale judged by ``Predictor.scale_check``)."""

    def __init__(self, in_scale: float, cross_scale: float, calibrated_tpp: float, **kw: Any) -> None:
        super().__init__(**kw)
        from predictors import Predictor, SurrogateParams
        from predictors.ranking import KindError, RankingError

        def table(v: float) -> dict:
            return {"eta_fixed_tau": KindError((0.1,), (v,), (v,), (10,), (2,))}

        self._real = Predictor(SurrogateParams(0.1, 0.0, 1.0, 0.0), provenance={"tokens_per_param": [calibrated_tpp]},
                               ranking_error=RankingError(table(in_scale), table(cross_scale),
                                                          "leave-one-sweep-out", "leave-one-TPP-out (3 groups)"))

    def ranking_scale(self, stop_fraction: float, kind: str, controls: Any = ()) -> tuple[float, str]:
        return self._real.ranking_scale(stop_fraction, kind, controls)


# Asserts: trials at a TPP the predictor was not calibrated on get the cross-scale ranking
# scale (a 4% gap is kept under 6%, stopped under the 2% in-scale one), and the margin says
# where it came from. The trials run at TPP 20.
@pytest.mark.parametrize("calibrated_tpp, kept", [(20.0, ["a"]), (80.0, ["a", "b"])])
def test_calibrated_margin_widens_for_trials_off_the_calibrated_scale(calibrated_tpp, kept):
    answers: list[dict] = []
    s = sched(margin_z=1.0, rungs=(0.1,), predictor=CrossScaleFakePredictor(0.02, 0.06, calibrated_tpp),
              on_early_answer=answers.append)
    FakeController(s, [stub("a", final=1.00, tau=0.5, lr=0.01), stub("b", final=1.04, tau=0.5, lr=0.02)]).run(workers=2)
    assert s.state.rungs[0].survivors == kept
    widened = calibrated_tpp != 20.0
    assert s.state.rungs[0].margin == pytest.approx(0.06 if widened else 0.02)
    assert ("leave-one-TPP-out" in answers[0]["margin_text"]) == widened


# Asserts: in async mode the calibrated margin keeps a late arrival within z·σ of the best recorded.
def test_async_calibrated_margin():
    s = sched(margin_z=1.0, decision_mode="async", rungs=(0.1,), predictor=RankedFakePredictor({0.1: 0.02}))
    trials = [stub("a", final=1.00, tau=0.5), stub("b", final=1.015, tau=0.5), stub("c", final=1.05, tau=0.5)]
    FakeController(s, trials).run(workers=1)
    assert outcome(s)["b"] == ("completed", None) and outcome(s)["c"] == ("stopped", 0.1)


# Asserts: NaN / inf losses and diverged=True STOP the trial, mark it diverged, and do not block a rung.
def test_nan_inf_and_diverged_do_not_block_rung():
    s = sched()
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5),
              stub("n", final=1.1, tau=0.5), stub("i", final=1.1, tau=0.5), stub("d", final=0.9, tau=0.5)]
    ctl = FakeController(s, trials)
    for t in trials:
        ctl.start(t)
    a, b, n, i, d = trials
    assert ctl.step(a) == CONTINUE and ctl.step(a) == PAUSE
    assert ctl.step(b) == CONTINUE and ctl.step(b) == PAUSE
    assert s.on_trial_result(ctl, n, make_result(1.1, 0.5, 0.05) | {"loss": float("nan")}) == STOP
    assert s.on_trial_result(ctl, i, make_result(1.1, 0.5, 0.05) | {"loss": float("inf")}) == STOP
    assert not s.state.rungs[0].decided  # d still has to reach the rung
    assert s.on_trial_result(ctl, d, make_result(0.9, 0.5, 0.05) | {"diverged": True}) == STOP
    # d was the last live trial below the rung: its divergence decides the rung (a kept, b stopped)
    assert s.state.rungs[0].decided and s.state.rungs[0].survivors == ["a"]
    assert {t: s.state.trials[t].status for t in "nid"} == {"n": "diverged", "i": "diverged", "d": "diverged"}
    assert s.state.trials["d"].diverged_at == pytest.approx(0.05)
    assert b.status == Trial.TERMINATED and s.trial_verdict("b") == "stopped_at_0.1"
    assert s.trial_verdict("n") == "diverged"
    # a diverged trial that is re-added and reports again gets STOP
    assert s.on_trial_result(ctl, n, make_result(1.1, 0.5, 0.1)) == STOP


# Asserts: a diverged final result (done=True → on_trial_complete, as our trainable sends) marks it diverged.
def test_diverged_result_via_on_trial_complete():
    s = sched()
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5)
    ctl = FakeController(s, [a, b])
    ctl.start(a)
    ctl.start(b)
    ctl.step(a)
    assert ctl.step(a) == PAUSE
    s.on_trial_complete(ctl, b, make_result(1.2, 0.5, 0.05) | {"loss": float("nan"), "diverged": True, "done": True})
    assert s.state.trials["b"].status == "diverged"
    assert s.state.rungs[0].decided and s.state.rungs[0].survivors == ["a"]
    assert s.choose_trial_to_run(ctl) is a


# Asserts: a trial added after a rung was decided is judged there against the recorded predictions.
def test_late_added_trial_judged_at_decided_rung():
    s = sched()
    trials = [stub(f"t{i}", final=f, tau=0.5) for i, f in enumerate([1.0, 1.1, 1.2, 1.3])]
    ctl = FakeController(s, trials)
    for t in trials:
        ctl.start(t)
    for t in trials:
        ctl.step(t)
    for t in trials:
        ctl.step(t)
    assert s.state.rungs[0].decided and s.state.rungs[0].survivors == ["t0", "t1"]
    t0, t1 = trials[0], trials[1]
    bad, good = stub("bad", final=1.25, tau=0.5), stub("good", final=0.95, tau=0.5)
    ctl.add(bad)
    ctl.add(good)
    # survivors run to 0.2 and wait there: the new live trials must reach 0.2 first
    for t in (t0, t1):
        ctl.start(t)
        ctl.step(t)
        assert ctl.step(t) == PAUSE
    assert not s.state.rungs[1].decided
    ctl.start(bad)
    ctl.step(bad)
    assert ctl.step(bad) == STOP  # 1.25 is 4th of 5 recorded at 0.1 → top ⌈5/2⌉ = 3 only
    entry = s.state.rungs[0].entries["bad"]
    assert entry.late and entry.decision == "stop" and "late arrival" in entry.reason
    ctl.start(good)
    ctl.step(good)
    assert ctl.step(good) == CONTINUE  # best of 5 at 0.1
    assert s.state.rungs[0].entries["good"].decision == "continue"
    assert s.choose_trial_to_run(ctl) is None  # t0, t1 still wait at 0.2 for "good"
    ctl.step(good)
    assert ctl.step(good) == CONTINUE  # reaches 0.2 and decides it: keeps good and t0
    assert s.state.rungs[1].survivors == ["t0", "good"]
    assert s.state.trials["t1"].stopped_at == 0.2


# Asserts: a trial erroring while others are PAUSED at a rung lets the rung be decided (no deadlock).
def test_error_while_others_paused_decides_rung():
    s = sched()
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5), stub("c", final=0.9, tau=0.5)]
    ctl = FakeController(s, trials)
    ctl.run(workers=2, errors={"c": 0.1})
    assert s.state.trials["c"].status == "error"
    assert s.state.rungs[0].n_participants == 2 and s.state.rungs[0].survivors == ["a"]
    assert outcome(s)["a"] == ("completed", None) and outcome(s)["b"] == ("stopped", 0.1)


# Asserts: a retried trial (on_trial_error then on_trial_add) is revived and judged late at a decided rung.
def test_retry_after_error_is_revived():
    s = sched()
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5), stub("c", final=0.9, tau=0.5)]
    ctl = FakeController(s, trials)
    a, b, c = trials
    for t in trials:
        ctl.start(t)
    ctl.step(c)
    ctl.step(a)
    ctl.step(a)
    ctl.step(b)
    ctl.step(b)
    s.on_trial_error(ctl, c)  # Ray's _requeue_trial: on_trial_error, status PENDING, on_trial_add
    assert s.state.rungs[0].decided and s.state.rungs[0].survivors == ["a"]
    c.set_status(Trial.PENDING)
    s.on_trial_add(ctl, c)
    assert s.state.trials["c"].status == "pending" and len(s.state.trials["c"].history) == 1
    ctl.start(c)
    assert ctl.step(c) == CONTINUE  # best recorded at 0.1 → continues
    assert s.state.rungs[0].entries["c"].late


# Asserts: the early answer follows the facts: the best trial errors before the first rung,
# the sweep announces a worse one; retried (or resumed), the best one arrives at the decided
# last rung, is kept, and the answer is announced again naming it, with what it replaces, why
# and when (it used to stay on the worse trial in predicted_best.json, the report and MLflow).
def test_early_answer_is_revised_when_a_better_trial_arrives_late():
    answers: list[dict] = []
    s = sched(rungs=(0.1, 0.2), on_early_answer=answers.append)
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5), stub("c", final=0.9, tau=0.5)]
    ctl = FakeController(s, trials)
    a, b, c = trials
    for t in trials:
        ctl.start(t)
    ctl.step(c)
    s.on_trial_error(ctl, c)
    c.set_status(Trial.ERROR)
    for _ in range(4):
        for t in (a, b):
            if t.status == Trial.PAUSED:
                t.set_status(Trial.RUNNING)
            if t.status == Trial.RUNNING:
                ctl.step(t)
    assert [x["trial_id"] for x in answers] == ["a"] and "revised" not in answers[0]
    c.set_status(Trial.PENDING)  # retried (or `hpo resume` with errored trials resumed)
    s.on_trial_add(ctl, c)
    ctl.start(c)
    for _ in range(3):
        ctl.step(c)
    assert [x["trial_id"] for x in answers] == ["a", "c"]
    revised = answers[-1]["revised"]
    assert revised["from"] == "a" and revised["to"] == "c" and "after the rung was decided" in revised["why"]
    assert revised["at"] and revised["revisions"] == 1
    assert s.state.early_answer["trial_id"] == "c"
    assert set(answers[0]) <= set(answers[-1])  # every key of the first announcement is kept


# Asserts: on_trial_add is idempotent (restore, retry, TERMINATED re-adds): no duplicates, history kept.
def test_on_trial_add_idempotent():
    s = sched()
    a = stub("a", final=1.0, tau=0.5)
    ctl = FakeController(s, [a])
    ctl.start(a)
    ctl.step(a)
    ctl.step(a)
    ctl.step(a)
    before = json.dumps(s.state.trials["a"].to_dict())
    for status in (Trial.RUNNING, Trial.PENDING, Trial.PAUSED):
        a.set_status(status)
        s.on_trial_add(ctl, a)
    assert list(s.state.trials) == ["a"]
    assert json.dumps(s.state.trials["a"].to_dict()) == before
    a.set_status(Trial.TERMINATED)
    s.on_trial_add(ctl, a)  # Ray's experiment state says it finished after our last write
    assert s.state.trials["a"].status == "completed" and len(s.state.trials["a"].history) == 3


# Asserts: restoring from scheduler_state.json keeps decisions, keeps stopped trials stopped, continues histories.
def test_restore_keeps_decisions(tmp_path):
    path = tmp_path / "scheduler_state.json"
    s = sched(state_path=path)
    pickled = pickle.dumps(s)  # what Tuner puts in tuner.pkl: the scheduler before the run
    trials = six_trials()
    ctl = FakeController(s, trials)
    by_id = {t.trial_id: t for t in trials}
    for t in trials:
        ctl.start(t)
    for _ in range(2):
        for t in trials:
            ctl.step(t)
    assert s.state.rungs[0].decided and s.state.rungs[0].survivors == ["t1", "t3", "t4"]
    ctl.start(by_id["t3"])
    ctl.step(by_id["t3"])
    assert ctl.step(by_id["t3"]) == PAUSE  # t3 waits at 0.2 when the "driver crashes"
    s.flush()
    saved = path.read_bytes()

    for make in (lambda: sched(state_path=path, resume=True), lambda: pickle.loads(pickled)):
        path.write_bytes(saved)
        restored = make()
        restored._strict = True
        # Ray re-adds every trial on restore: unfinished ones PENDING, finished ones TERMINATED
        fresh = [stub(t.trial_id, **t.config) for t in trials]
        for t in fresh:
            if t.trial_id in ("t0", "t2", "t5"):
                t.set_status(Trial.TERMINATED)
        ctl2 = FakeController(restored, fresh)
        assert restored.state.rungs[0].decided and restored.state.rungs[0].survivors == ["t1", "t3", "t4"]
        assert restored.state.trials["t0"].status == "stopped"
        assert len(restored.state.trials["t3"].history) == 4
        # a stopped trial that Ray re-adds as PENDING gets STOP on its next result
        t0 = next(t for t in fresh if t.trial_id == "t0")
        t0.set_status(Trial.RUNNING)
        assert restored.on_trial_result(ctl2, t0, make_result(1.3, 0.2, 0.15)) == STOP
        # t3 resumes from its checkpoint past 0.2: still waits at the undecided rung 0.2
        t3 = next(t for t in fresh if t.trial_id == "t3")
        t3.set_status(Trial.RUNNING)
        assert restored.on_trial_result(ctl2, t3, make_result(1.0, 1.5, 0.25)) == PAUSE
        assert len(restored.state.trials["t3"].history) == 5
        assert restored.state.rungs[0].decided_at == s.state.rungs[0].decided_at  # not re-decided
        assert restored.choose_trial_to_run(ctl2).trial_id in ("t1", "t4")  # PENDING, not t3


# Asserts: when a rung's decision reaches disk its losers are already marked stopped, so a
# driver killed before the controller's stop calls cannot resurrect them on resume.
def test_decision_is_saved_with_its_losers_stopped(tmp_path):
    path = tmp_path / "scheduler_state.json"
    s = sched(state_path=path)
    trials = six_trials()
    ctl = FakeController(s, trials)
    on_disk_at_stop: dict[str, str] = {}
    plain_stop = ctl.stop_trial

    def stop_and_look(trial: Trial) -> None:
        saved = json.loads(path.read_text())
        on_disk_at_stop[trial.trial_id] = saved["trials"][trial.trial_id]["status"]
        plain_stop(trial)

    ctl.stop_trial = stop_and_look  # type: ignore[method-assign]
    for t in trials:
        ctl.start(t)
    for _ in range(2):
        for t in trials:
            ctl.step(t)
    assert s.state.rungs[0].decided
    assert on_disk_at_stop and set(on_disk_at_stop.values()) == {"stopped"}


# Asserts: a trial the saved state has stopped but Ray restores as PENDING is ended, never run,
# so a resumed sweep does not wait on it forever.
def test_restored_stopped_trial_is_terminated_not_run(tmp_path):
    path = tmp_path / "scheduler_state.json"
    s = sched(state_path=path)
    trials = six_trials()
    ctl = FakeController(s, trials)
    for t in trials:
        ctl.start(t)
    for _ in range(2):
        for t in trials:
            ctl.step(t)
    s.flush()
    stopped = {tid for tid, rec in s.state.trials.items() if rec.status == "stopped"}
    assert stopped
    restored = sched(state_path=path, resume=True)
    fresh = [stub(t.trial_id, **t.config) for t in trials]  # all PENDING, as after a hard kill
    ctl2 = FakeController(restored, fresh)
    chosen = restored.choose_trial_to_run(ctl2)
    assert chosen is not None and chosen.trial_id not in stopped
    assert set(ctl2.stop_calls) == stopped
    assert all(t.status == Trial.TERMINATED for t in fresh if t.trial_id in stopped)
    assert all(restored.state.trials[tid].status == "stopped" for tid in stopped)


# Asserts: a state file written with other rungs or another mode is refused; a malformed one names the file.
def test_restore_refuses_mismatched_or_malformed_state(tmp_path):
    path = tmp_path / "scheduler_state.json"
    sched(state_path=path).flush()
    with pytest.raises(ValueError, match="rungs"):
        sched(state_path=path, rungs=(0.2, 0.4), resume=True)
    with pytest.raises(ValueError, match="decision mode"):
        sched(state_path=path, decision_mode="audit", resume=True)
    path.write_text("{")
    with pytest.raises(StateFileError, match="scheduler_state.json"):
        sched(state_path=path, resume=True)


# Asserts: a new scheduler never inherits another experiment's decisions: an existing state file
# is refused unless resume=True, and an unpickled scheduler refuses a file of another experiment.
def test_state_identity(tmp_path):
    path = tmp_path / "scheduler_state.json"
    first = sched(state_path=path)
    pickled = pickle.dumps(first)
    FakeController(first, six_trials()).run(workers=2)
    with pytest.raises(ValueError, match="holds the state of experiment"):
        sched(state_path=path)
    resumed = sched(state_path=path, resume=True)
    assert resumed.state.experiment_id == first.state.experiment_id and resumed.state.rungs[2].decided
    assert pickle.loads(pickled).state.rungs[2].decided  # Tuner.restore: its own file
    path.unlink()
    other = sched(state_path=path)
    other.flush()
    with pytest.raises(ValueError, match="not this scheduler's"):
        pickle.loads(pickled)
    with pytest.raises(ValueError, match="no state to resume"):
        sched(state_path=tmp_path / "absent.json", resume=True)


# Asserts: a loser whose PAUSE-save is still in flight (RUNNING, is_saving) is stopped via stop_trial.
def test_loser_still_saving_is_stopped_via_stop_trial():
    s = sched()
    a, b = stub("a", final=1.2, tau=0.5), stub("b", final=1.0, tau=0.5)
    ctl = FakeController(s, [a, b])
    ctl.start(a)
    ctl.start(b)
    ctl.step(a)
    assert s.on_trial_result(ctl, a, make_result(1.2, 0.5, 0.1)) == PAUSE
    ctl.last_result["a"] = make_result(1.2, 0.5, 0.1)
    a.temporary_state.saving_to = object()  # the controller is saving a's checkpoint
    ctl.step(b)
    assert ctl.step(b) == CONTINUE
    assert ctl.stop_calls == ["a"] and a.status == Trial.TERMINATED
    assert s.state.trials["a"].status == "stopped" and s.state.trials["a"].stopped_at == 0.1


# Asserts: a predictor failure or too few points keeps the trial (no prediction, never stopped on no evidence).
def test_unpredictable_trials_are_kept():
    s = sched(predictor=FakePredictor(fail_for_tau=0.7), rungs=(0.1,))
    s._strict = False  # the predictor raising is logged, not raised
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5), stub("x", final=2.0, tau=0.7)]
    FakeController(s, trials).run(workers=2)
    assert outcome(s) == {"a": ("completed", None), "b": ("stopped", 0.1), "x": ("completed", None)}
    assert s.state.rungs[0].entries["x"].reason.startswith("no prediction (predictor failed")
    s2 = sched(min_points=5, rungs=(0.1,))
    FakeController(s2, [stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5)]).run(workers=2)
    assert all(rec.status == "completed" for rec in s2.state.trials.values())
    assert "min_points=5" in s2.state.rungs[0].entries["b"].reason


# ---------------------------------------------------------------------------- async / audit


# Asserts: async compares each arrival with the recorded predictions (first arrivals continue), never pauses.
def test_async_mode_exact_stops():
    answers: list[dict] = []
    s = sched(decision_mode="async", on_early_answer=answers.append)
    ctl = FakeController(s, six_trials())
    ctl.run(workers=1)  # one at a time: t0 … t5 arrive in order
    assert PAUSE not in {d for _, _, d in ctl.decisions}
    assert outcome(s) == {
        "t0": ("completed", None), "t1": ("completed", None), "t2": ("stopped", 0.1),
        "t3": ("completed", None), "t4": ("stopped", 0.2), "t5": ("stopped", 0.1),
    }
    assert "first prediction recorded" in s.state.rungs[0].entries["t0"].reason
    assert len(answers) == 1 and answers[0]["trial_id"] == "t3"


# Asserts: async at the last rung stops an arrival worse than the best recorded by more than the margin.
def test_async_last_rung_margin():
    s = sched(decision_mode="async", rungs=(0.1,), margin=0.014)
    trials = [stub("a", final=1.0, tau=0.5), stub("b", final=1.01, tau=0.5), stub("c", final=1.05, tau=0.5)]
    FakeController(s, trials).run(workers=1)
    # b (0.995% worse) continues, c (4.9% worse) stops
    assert outcome(s) == {"a": ("completed", None), "b": ("completed", None), "c": ("stopped", 0.1)}


# Asserts: audit never stops or pauses, and records would_stop exactly where sync would stop.
def test_audit_records_would_stop_only():
    answers: list[dict] = []
    s = sched(decision_mode="audit", on_early_answer=answers.append)
    ctl = FakeController(s, six_trials())
    ctl.run(workers=2, rng=random.Random(3))
    assert {d for _, _, d in ctl.decisions} == {CONTINUE}
    assert all(rec.status == "completed" for rec in s.state.trials.values())
    assert {t: r.would_stop_at for t, r in s.state.trials.items()} == {
        "t0": 0.1, "t2": 0.1, "t5": 0.1, "t4": 0.2, "t1": 0.3, "t3": None}
    assert [r.survivors for r in s.state.rungs] == [["t1", "t3", "t4"], ["t1", "t3"], ["t3"]]
    assert s.state.rungs[0].entries["t0"].decision == "would_stop"
    assert s.state.rungs[2].entries["t3"].decision == "would_keep"
    # the rung-0.2 predictions use the curve up to 0.2 even though the trials ran on
    assert s.state.rungs[1].entries["t1"].train_fraction == pytest.approx(0.2)
    assert len(answers) == 1 and answers[0]["trial_id"] == "t3"


# ---------------------------------------------------------------------------- API


# Asserts: the scheduler's metric is its settings' (the predictor was fitted on one) and its mode
# "min": TuneConfig may repeat them, another metric is refused (False: Ray reports the conflict),
# mode="max" is refused with a message (losses are minimised); bad settings are refused before
# a scheduler exists; the scheduler takes the settings object, not loose keywords.
def test_set_search_properties_and_mode():
    s = CollapseScheduler(predictor=FakePredictor())
    assert s.metric == "loss" and s.mode == "min"
    assert s.set_search_properties("loss", "min") is True and s.set_search_properties(None, None) is True
    assert s.set_search_properties("val_loss", None) is False
    assert CollapseScheduler(predictor=FakePredictor(), settings=SchedulerSettings(metric="val_loss")).metric == "val_loss"
    with pytest.raises(ValueError, match="max"):
        s.set_search_properties("loss", "max")
    with pytest.raises(ValueError, match="mode"):
        SchedulerSettings(mode="fast")
    with pytest.raises(ValueError, match="rungs"):
        SchedulerSettings(rungs=(0.3, 0.2))
    with pytest.raises(TypeError):
        CollapseScheduler(predictor=FakePredictor(), rungs=(0.1,))  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="predict_final"):
        CollapseScheduler(predictor=object())


# Asserts: results that break the report contract stop the sweep with a message naming the
# problem: a missing training fraction, one outside [0, 1] (an iteration count), a result for a
# trial never added.
def test_contract_violations_are_errors():
    from hpo.decisions.scheduler import SchedulerContractError

    s = sched()
    a = stub("a", final=1.0, tau=0.5)
    ctl = FakeController(s, [a])
    ctl.start(a)
    bad = make_result(1.0, 0.5, 0.05)
    del bad["train_fraction"]
    with pytest.raises(SchedulerContractError, match="train_fraction"):
        s.on_trial_result(ctl, a, bad)
    with pytest.raises(SchedulerContractError, match="outside \\[0, 1\\]"):
        s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.05) | {"train_fraction": 12.0})
    with pytest.raises(SchedulerContractError, match="never added"):
        s.on_trial_result(ctl, stub("ghost", final=1.0, tau=0.5), make_result(1.0, 0.5, 0.05))


# Asserts: t̂ going back within one run of a trainable (Ray's iterations_since_restore grows)
# stops the sweep with a message naming the trial and both values; the same step back after a
# restore (iterations_since_restore starts again) is a rewind, accepted.
def test_t_hat_going_back_within_one_run_is_refused():
    from hpo.common.errors import InputError
    from hpo.decisions.scheduler import SchedulerContractError

    s = sched()
    a = stub("a", final=1.0, tau=0.5)
    ctl = FakeController(s, [a])
    ctl.start(a)
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.06, iterations_since_restore=1))
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.08, iterations_since_restore=2))
    with pytest.raises(SchedulerContractError, match=r"trial a: train_fraction went back from 0.08 to 0.04") as err:
        s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.04, iterations_since_restore=3))
    assert isinstance(err.value, InputError)  # the CLI prints it as one line, exit 2
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.02, iterations_since_restore=1))  # restored
    assert s.state.trials["a"].history[-1][0] == pytest.approx(0.02)

# Asserts: a trial whose results and config lack tau or tokens_per_param is a contract error
# naming the keys (before: every trial was silently kept at every rung, "predicted best None");
# a missing schedule/warmup is said once per sweep, naming the keys and the defaults assumed.
def test_missing_controls_are_errors_and_a_missing_schedule_is_said_once(caplog):
    from hpo.decisions.scheduler import SchedulerContractError

    for drop, named in ((("tau",), "'tau'"), (("tau", "tokens_per_param"), "'tau' or 'tokens_per_param'"),
                        (("tokens_per_param",), "'tokens_per_param'")):
        s = sched()
        a = stub("a", final=1.0)
        ctl = FakeController(s, [a])
        ctl.start(a)
        result = {k: v for k, v in make_result(1.0, 0.5, 0.05).items() if k not in drop}
        with pytest.raises(SchedulerContractError, match=f"trial a: neither its result nor its config has {named} "):
            s.on_trial_result(ctl, a, result)
    s = sched()
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.0, tau=0.5)
    ctl = FakeController(s, [a, b])
    caplog.set_level(logging.WARNING, logger="hpo.decisions.scheduler")
    for trial in (a, b):
        ctl.start(trial)
        plain = {k: v for k, v in make_result(1.0, 0.5, 0.05).items() if k not in ("schedule", "warmup_fraction")}
        assert s.on_trial_result(ctl, trial, plain) == CONTINUE
    said = [r.getMessage() for r in caplog.records if "assuming" in r.getMessage()]
    assert len(said) == 1, said
    assert "no 'schedule' or 'warmup_fraction': assuming schedule='linear', warmup_fraction=0.1" in said[0]
    assert s.state.trials["b"].controls.schedule.name == "linear"
    c = stub("c", final=1.0, tau=0.5)
    ctl.add(c)
    ctl.start(c)
    with pytest.raises(SchedulerContractError, match="unusable controls: schedule: unknown name 'cosin'"):
        s.on_trial_result(ctl, c, make_result(1.0, 0.5, 0.05, schedule="cosin"))


# Asserts: a contract error raised in Tune's loop, which Ray wraps in a TuneError of ~90 lines
# with the message at the bottom, is said first in one line, and an uncaught one ends the user's
# own script with exit status 2 and no traceback; any other uncaught error keeps its traceback.
def test_a_contract_error_in_a_users_script_is_one_line_first_and_exit_2(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    script = f"""
import sys, traceback
sys.path.insert(0, {str(tests)!r})
from ray.tune.error import TuneError
from test_scheduler import FakeController, make_result, sched, stub
s = sched()
a = stub("a", final=1.0)
ctl = FakeController(s, [a])
ctl.start(a)
print("made it to the first result", file=sys.stderr, flush=True)
try:
    s.on_trial_result(ctl, a, {{k: v for k, v in make_result(1.0, 0.5, 0.05).items() if k != "tau"}})
except Exception:
    if sys.argv[1] == "other":
        raise RuntimeError("an unrelated failure")
    raise TuneError(traceback.format_exc())  # what Ray's TuneController._on_result does
"""
    (tmp_path / "mine.py").write_text(script)
    for case in ("contract", "other"):
        run = subprocess.run([sys.executable, str(tmp_path / "mine.py"), case], capture_output=True, text=True,
                             timeout=300)
        lines = run.stderr.split("made it to the first result\n", 1)[1].strip().splitlines()
        assert lines[0].startswith("error: CollapseScheduler: trial a: neither its result nor its config has 'tau'")
        if case == "contract":
            assert run.returncode == 2 and len(lines) == 1, run.stderr[-3000:]
        else:
            assert run.returncode == 1 and "RuntimeError: an unrelated failure" in lines[-1], run.stderr[-3000:]


# Asserts: controls missing from the results are read from the trial's config; a trial whose
# first report is its last (t̂ = 1) is never paused (it would run twice).
def test_controls_from_config_and_no_pause_at_the_end():
    s = sched(rungs=(0.1,))
    trials = [stub("a", final=1.0, tau=0.5, tokens_per_param=20.0), stub("b", final=1.2, tau=0.5)]
    ctl = FakeController(s, trials)
    a, b = trials
    for t in trials:
        ctl.start(t)
    plain = {k: v for k, v in make_result(1.0, 0.5, 0.05).items() if k not in ("tau", "tokens_per_param")}
    s.on_trial_result(ctl, a, plain)
    assert s.state.trials["a"].controls.tau == 0.5
    assert s.on_trial_result(ctl, b, make_result(1.2, 0.5, 1.0)) == CONTINUE  # at t̂ = 1: no PAUSE


# Asserts: summary() and debug_string() report per-trial progress, rungs and bests.
def test_summary_and_debug_string():
    s = sched()
    ctl = FakeController(s, six_trials())
    for t in ctl.trials:
        ctl.start(t)
        ctl.step(t)
        ctl.step(t)
    summ = s.summary()
    json.dumps(summ)
    assert summ["rung_status"][0]["decided"] and summ["rung_status"][0]["survivors"] == ["t1", "t3", "t4"]
    assert summ["trials"]["t0"]["status"] == "stopped" and summ["trials"]["t0"]["verdict"] == "stopped_at_0.1"
    assert summ["trials"]["t3"]["predicted_final_loss"] == pytest.approx(1.0)
    assert summ["trials"]["t3"]["train_fraction"] == pytest.approx(0.1)
    assert summ["predicted_best"]["trial_id"] == "t3"
    assert summ["current_best"]["trial_id"] in ("t1", "t4", "t3")
    assert summ["compute_fraction"] == pytest.approx(0.1) and summ["early_answer"] is None
    text = s.debug_string()
    assert "rung 0.1: decided, kept 3/6 [t1, t3, t4]" in text and "rung 0.2: waiting" in text
    assert s.latest_prediction("t3") == pytest.approx(1.0) and s.latest_prediction("zz") is None


# Asserts: compute fraction weighs trials by reported N·D.
def test_compute_fraction_weighted():
    s = sched()
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.0, tau=0.5)
    ctl = FakeController(s, [a, b])
    ctl.start(a)
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.05, n_params=3e6, total_tokens=1e8))
    s.on_trial_result(ctl, b, make_result(1.0, 0.5, 0.05, n_params=1e6, total_tokens=1e8))
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.08, n_params=3e6, total_tokens=1e8))
    assert s.compute_fraction() == pytest.approx((0.08 * 3 + 0.05 * 1) / 4)


# Asserts: a restore from an earlier checkpoint (t̂ going back) truncates the history, not duplicates it.
def test_history_rewind_on_restore():
    s = sched(rungs=(0.5,))
    a = stub("a", final=1.0, tau=0.5)
    ctl = FakeController(s, [a])
    ctl.start(a)
    for k in range(1, 5):
        s.on_trial_result(ctl, a, make_result(1.0, 0.5, k * DT))
    s.on_trial_result(ctl, a, make_result(1.0, 0.5, 2 * DT))
    assert [p[0] for p in s.state.trials["a"].history] == pytest.approx([0.05, 0.1])


# ---------------------------------------------------------------------------- Ray end-to-end


def _curve_trainable(finals: dict):
    """A class Trainable reporting the synthetic curve of ``finals[config["name"]]``; defined
    in a function so Ray's cloudpickle ships it by value to the workers."""
    from ray import tune

    class Curve(tune.Trainable):
        def setup(self, config):
            self.k = 0
            self.final, self.tau = finals[config["name"]]

        def step(self):
            self.k += 1
            t = round(self.k * 0.05, 10)
            return {
                "loss": self.final * (1.0 + self.tau * (1.0 - t)), "train_fraction": t,
                "tau": self.tau, "tokens_per_param": 20.0, "schedule": "linear",
                "warmup_fraction": 0.1, "done": t >= 1.0 - 1e-9,
            }

        def reset_config(self, new_config):  # lets Tune reuse actors (much faster on 2 CPUs)
            self.k = 0
            self.final, self.tau = finals[new_config["name"]]
            return True

        def save_checkpoint(self, checkpoint_dir):
            return {"k": self.k}

        def load_checkpoint(self, checkpoint):
            self.k = int(checkpoint["k"])

    return Curve


# Asserts: through real Ray Tune (2 CPUs, 5 trials, sync), exactly the predicted best finishes and
# the others are stopped at the expected rungs, resuming survivors from their PAUSE checkpoints.
def test_end_to_end_ray_tune_sync(tmp_path):
    ray = pytest.importorskip("ray")
    from ray import tune

    finals = {"a": (1.30, 0.2), "b": (1.10, 0.6), "c": (1.50, 0.1), "d": (1.00, 1.5), "e": (1.20, 0.3)}
    answers: list[dict] = []
    scheduler = CollapseScheduler(
        predictor=FakePredictor(), settings=SchedulerSettings(min_points=2, rungs=[0.1, 0.2, 0.3]),
        state_path=tmp_path / "scheduler_state.json", on_early_answer=answers.append, persist_interval_s=0.5,
    )

    class Seen(tune.Callback):
        def __init__(self):
            self.t_hat: dict[str, list[float]] = {}

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.t_hat.setdefault(trial.config["name"], []).append(round(result["train_fraction"], 6))

    seen = Seen()
    started = time.monotonic()
    own_ray = not ray.is_initialized()  # do not tear down a cluster another test started
    if own_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"ray.init: {time.monotonic() - started:.1f} s")
    try:
        tuner = tune.Tuner(
            tune.with_resources(_curve_trainable(finals), {"cpu": 1}),
            param_space={"name": tune.grid_search(list(finals))},
            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=True),
            run_config=tune.RunConfig(name="e2e", storage_path=str(tmp_path / "ray"), verbose=0,
                                      callbacks=[seen]),
        )
        grid = tuner.fit()
    finally:
        if own_ray:
            ray.shutdown()
    state = SchedulerState.load(tmp_path / "scheduler_state.json")
    by_name = {rec.config["name"]: rec for rec in state.trials.values()}
    got = {name: (rec.status, rec.stopped_at) for name, rec in by_name.items()}
    # 5 → ⌈5/2⌉ = 3 at 0.1 (a, c stopped), → 2 at 0.2 (e stopped), → 1 at 0.3 (b stopped)
    assert got == {"a": ("stopped", 0.1), "c": ("stopped", 0.1), "e": ("stopped", 0.2),
                   "b": ("stopped", 0.3), "d": ("completed", None)}
    for name, rec in by_name.items():  # no trial ran past the rung it was stopped at
        assert rec.last_train_fraction == pytest.approx(rec.stopped_at or 1.0), name
    last = {r.config["name"]: r.metrics["train_fraction"] for r in grid}
    assert last == pytest.approx({"a": 0.1, "c": 0.1, "e": 0.2, "b": 0.3, "d": 1.0})
    # d's curve is continuous across its three pause/resume cycles: each resume restored the
    # PAUSE checkpoint (a restart from scratch would report 0.05 again)
    assert seen.t_hat["d"] == [round(0.05 * k, 6) for k in range(1, 21)]
    assert seen.t_hat["b"] == [round(0.05 * k, 6) for k in range(1, 7)]
    assert [round(t, 6) for t, _ in by_name["d"].history] == seen.t_hat["d"]
    assert len(answers) == 1 and answers[0]["config"]["name"] == "d"
    print(f"end-to-end Ray run: {time.monotonic() - started:.1f} s")


# Asserts: a trial that restarts from scratch after a PAUSE (a function trainable without
# checkpoints) is warned about once and its repeated work counts in the compute fraction.
def test_restart_without_checkpoint_counts_the_redone_work(caplog):
    s = sched(rungs=(0.1, 0.5))
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5)
    ctl = FakeController(s, [a, b])
    for t in (a, b):
        ctl.start(t)
    for k in (1, 2):
        s.on_trial_result(ctl, a, make_result(1.0, 0.5, k * DT))
        s.on_trial_result(ctl, b, make_result(1.2, 0.5, k * DT))  # b decides rung 0.1: a kept
    with caplog.at_level("WARNING"):
        s.on_trial_result(ctl, a, make_result(1.0, 0.5, DT))  # resumed at step 1 again
    assert "does not restore checkpoints" in caplog.text
    assert s.state.trials["a"].redone == pytest.approx(DT)
    assert s.compute_fraction() == pytest.approx((0.05 + 0.05 + 0.1) / 2)


# Asserts: every rung decision is published through on_decision the moment it is made, with the
# kept and stopped trials and the per-rung progress, before the early answer.
def test_on_decision_publishes_each_rung():
    events: list[tuple[str, dict]] = []
    s = sched(on_decision=lambda d: events.append(("decision", d)),
              on_early_answer=lambda a: events.append(("answer", a)))
    FakeController(s, six_trials()).run(workers=2)
    assert [e for e, _ in events] == ["decision", "decision", "decision", "answer"]
    first = events[0][1]
    assert first["fraction"] == 0.1 and sorted(first["kept"]) == ["t1", "t3", "t4"]
    assert sorted(first["stopped"]) == ["t0", "t2", "t5"]
    assert first["progress"][0] == {"fraction": 0.1, "decided": True, "reached": 6, "alive": 3, "stopped": 3,
                                    "finished": 0}
    json.dumps(events)


# Asserts: the last rung's decision and the early answer reach the state file in one write: when
# the decision is announced, the file already names the answer (a driver killed in between
# cannot leave a decided last rung without one), and the answer is announced after it.
def test_last_rung_decision_is_written_with_the_early_answer(tmp_path):
    path = tmp_path / "scheduler_state.json"
    seen: list[tuple[str, Any]] = []

    def on_decision(d: dict) -> None:
        seen.append(("decision", json.loads(path.read_text())["early_answer"]))

    s = sched(state_path=path, on_decision=on_decision, on_early_answer=lambda a: seen.append(("answer", a)))
    FakeController(s, six_trials()).run(workers=2)
    assert [kind for kind, _ in seen] == ["decision", "decision", "decision", "answer"]
    assert seen[0][1] is None and seen[1][1] is None
    assert seen[2][1]["trial_id"] == "t3" and seen[3][1] == seen[2][1]


class OrderFakePredictor(FakePredictor):
    """A fake whose order and margin come from a real ``Predictor`` calibrated at TPP 80 (the
    trials run at TPP 20, ln 4 = 1.39 away), with a held-out TPP group 1.5 away that holds
    ``group_scale`` for the predicted finals (1.0: no evidence at all)."""

    def __init__(self, group_scale: float, **kw: Any) -> None:
        super().__init__(**kw)
        from predictors import Predictor, SurrogateParams
        from predictors.ranking import HeldOutGroup, KindError, Position, RankingError

        def kind(scale: float) -> KindError:
            return KindError((0.1,), (scale,), (scale,), (10,), (2,), agreement=(0.9,), loss_agreement=(0.8,),
                             loss_scale=(0.03,), weight=(1.0,), order_agreement=(0.9,), order_scale=(scale,))

        group = HeldOutGroup(10.0, Position("tokens_per_param", False, 1.5), {"eta_fixed_tau": kind(group_scale)})
        self._real = Predictor(SurrogateParams(0.1, 0.0, 1.0, 0.0), provenance={"tokens_per_param": [80.0]},
                               ranking_error=RankingError({"eta_fixed_tau": kind(0.02)}, cross_groups=(group,)))

    def ranking_order(self, stop_fraction: float, kind: str, controls: Any = ()) -> Any:
        return self._real.ranking_order(stop_fraction, kind, controls)


# Asserts (issue 25): a sweep off the calibrated scale still stops trials. Where held-out
# sweeps as far away measured the predicted order, that order and its scale apply; where they
# hold no evidence (the old 100% cap that kept everyone), the rung ranks by the losses at the
# rung with their measured scale, and keeps ⌈n/rf⌉ plus the margin, never everyone.
@pytest.mark.parametrize("group_scale, order", [(0.01, "predicted finals"), (1.0, "losses at the rung")])
def test_off_scale_sweep_keeps_fewer_than_all(group_scale, order):
    s = sched(rungs=(0.1, 0.2), predictor=OrderFakePredictor(group_scale))
    trials = [stub(f"t{i}", final=1.0 + 0.05 * i, tau=0.5, lr=0.001 * (i + 1)) for i in range(6)]
    FakeController(s, trials).run(workers=6)
    rung = s.state.rungs[0]
    assert rung.n_participants == 6 and rung.n_keep == 3 and not rung.kept_all
    assert f"order: {order}" in rung.margin_source
    assert rung.order_weight == (1.0 if order == "predicted finals" else 0.0)


# Asserts (issue 25): a sweep whose predictions all lie within the tolerance (the same result
# within seed noise) keeps ⌈n/rf⌉ at a rung, though the margin covers all of them.
def test_sweep_within_the_tolerance_keeps_the_rule_survivors():
    trials = [stub(f"t{i}", final=1.0 + 0.002 * i, tau=0.5) for i in range(6)]
    wide = sched(margin_z=1.0, rungs=(0.1, 0.2), predictor=RankedFakePredictor({0.1: 0.05, 0.2: 0.05}))
    FakeController(wide, [stub(t.trial_id, **t.config) for t in trials]).run(workers=6)
    assert wide.state.rungs[0].kept_all and wide.state.rungs[0].n_keep == 6
    tolerant = sched(margin_z=1.0, rungs=(0.1, 0.2), tolerance=0.02,
                     predictor=RankedFakePredictor({0.1: 0.05, 0.2: 0.05}))
    FakeController(tolerant, trials).run(workers=6)
    assert tolerant.state.rungs[0].n_keep == 3 and not tolerant.state.rungs[0].kept_all
    assert "within the tolerance" in tolerant.state.rungs[0].entries["t5"].reason


# Asserts: the scheduler's bookkeeping scales: over a whole simulated sync sweep,
# choose_trial_to_run never walks the controller's trial list and the rung-readiness checks
# look at each trial a bounded number of times (both were a walk per call: quadratic, 47 s per
# rung round at 10,000 trials); and the sweep ends as the definition says (same survivors and
# stops as with the walks, checked call by call in the other tests' strict mode).
def test_bookkeeping_is_not_quadratic_in_the_trials():
    from hpo.trials.simulator import SimulatedSweep

    n = 600
    rng = random.Random(7)
    runs = {}
    for i in range(n):
        final, tau = rng.uniform(1.0, 1.5), rng.uniform(0.1, 1.5)
        runs[f"t{i:04d}"] = [make_result(final, tau, round(k * DT, 6)) for k in range(1, int(round(1 / DT)) + 1)]
    s = CollapseScheduler(predictor=FakePredictor(), settings=SchedulerSettings(min_points=2, rungs=[0.1, 0.2, 0.3]))
    counts = {"walked": 0, "live": 0}

    class Counted(list):
        def __iter__(self):
            for item in list.__iter__(self):
                counts["walked"] += 1
                yield item

    live = SchedulerState.live
    s.state.live = lambda rec: (counts.__setitem__("live", counts["live"] + 1), live(s.state, rec))[1]
    sweep = SimulatedSweep(s, runs, n_workers=8)
    sweep.trials = Counted(sweep.trials)
    outcome = sweep.run()
    assert all(rung.decided for rung in s.state.rungs) and len(outcome.completed) >= 1
    assert counts["walked"] <= 2 * n, counts  # the simulator's own start-up walk, not one per call
    assert counts["live"] <= 40 * n, counts


# Asserts: a survivor whose pause checkpoint is still being written when its rung is decided
# (Ray keeps it RUNNING until the save ends, and may ask for a trial to run meanwhile) is
# still chosen once it is PAUSED: two trials reaching the rung together must not hang the sweep.
def test_survivor_still_saving_its_pause_is_resumed():
    s = sched(rungs=(0.2,))
    a, b = stub("a", final=1.0, tau=0.5), stub("b", final=1.2, tau=0.5)
    ctl = FakeController(s, [a, b])
    for t in (a, b):
        ctl.start(t)
    for _ in range(3):
        ctl.step(a)
        ctl.step(b)
    assert s.on_trial_result(ctl, a, make_result(1.0, 0.5, 0.2)) == PAUSE  # a saves; still RUNNING
    ctl.pos["a"] = 4
    assert s.choose_trial_to_run(ctl) is None  # nothing may run yet (a waits, b runs)
    assert ctl.step(b) == STOP  # b decides the rung: a kept, b stopped
    assert s.choose_trial_to_run(ctl) is None  # a is still RUNNING (its save has not ended)
    a.set_status(Trial.PAUSED)  # the save ends: Ray applies the cached PAUSE
    assert s.choose_trial_to_run(ctl) is a


class WobblyFakePredictor(FakePredictor):
    """A FakePredictor whose predictions move between looks (a per-trial drift with t̂) and whose
    curves miss the shape (a residual per trial), with a calibrated order of σ 1% on the finals."""

    def predict_final(self, t_hat: np.ndarray, loss: np.ndarray, controls: Any) -> FakePrediction:
        p = super().predict_final(t_hat, loss, controls)
        drift = 1.0 + 0.05 * math.sin(37.0 * controls.tau) * float(t_hat[-1])
        return FakePrediction(p.final_loss * drift, p.uncertainty, p.stop_fraction, n_points=p.n_points,
                              residual=0.01 * controls.tau)

    def ranking_order(self, stop_fraction: float, kind: str, controls: Any = ()) -> Any:
        from predictors.ranking import Order

        return Order(1.0, 0.01, f"{kind} sweeps (test table)")


# Asserts: async (four trials arriving one by one) records the margin the rule applied, to the
# digit the sync decision on the same trials records (z·√(σ_cal² + σ_moved² + σ_misfit²), not
# z·σ_cal), and the last arrival's reason states that same margin.
def test_async_and_sync_record_the_margin_the_rule_applied():
    trials = lambda: [stub(t, final=f, tau=tau) for t, f, tau in  # noqa: E731
                      [("a", 1.00, 0.3), ("b", 1.02, 0.4), ("c", 1.04, 0.5), ("d", 1.06, 0.6)]]
    synced = sched(rungs=(0.3,), margin_z=0.5, predictor=WobblyFakePredictor())
    FakeController(synced, trials()).run(workers=4)
    arrived = sched(rungs=(0.3,), margin_z=0.5, predictor=WobblyFakePredictor(), decision_mode="async")
    FakeController(arrived, trials()).run(workers=1)
    sync_rung, async_rung = synced.state.rungs[0], arrived.state.rungs[0]
    assert sync_rung.margin > 0.5 * 0.01 * 1.2  # wider than z·σ_calibrated: the sweep's evidence is in it
    assert async_rung.margin == pytest.approx(sync_rung.margin, rel=1e-12)
    assert async_rung.margin_source == sync_rung.margin_source and "moved since the last look" in sync_rung.margin_source
    last = list(async_rung.entries.values())[-1]  # the entries in the order they arrived
    assert f"{100 * sync_rung.margin:.2f}%" in last.reason and "(against 3 recorded)" in last.reason
    assert async_rung.sigma == pytest.approx(sync_rung.sigma) and sync_rung.sigma > 0.01


# Asserts: whatever rule decided the last rung, the early answer names the rung's pick and ranks
# by the rule's order, and states P(best) only where the σ of that order is known. Trial a has
# the best predicted final but a high loss at the rung (τ 0.9); b has the lowest loss there.
@pytest.mark.parametrize("rule, pick, order, p_stated", [
    ("asha", "b", "losses at the rung", False), ("current-best", "b", "losses at the rung", False),
    ({"name": "top-k", "k": 2}, "a", "predicted finals", True), ("collapse", "a", "predicted finals", True)])
def test_the_early_answer_follows_the_rule_that_decided(rule, pick, order, p_stated):
    answers: list[dict] = []
    s = sched(rungs=(0.3,), rule=rule, predictor=RankedFakePredictor({0.3: 0.02}), on_early_answer=answers.append)
    FakeController(s, [stub("a", final=1.00, tau=0.9), stub("b", final=1.05, tau=0.1), stub("c", final=1.03, tau=0.3),
                       stub("d", final=1.20, tau=0.8)]).run(workers=4)
    rung = s.state.rungs[0]
    assert len(answers) == 1 and answers[0]["trial_id"] == rung.predicted_best == pick
    assert answers[0]["order"] == order and (answers[0]["probability_best"] is not None) == p_stated


# Asserts: a resume whose rule has another knob than the state's is refused in one line naming both.
def test_resume_with_another_rule_knob_is_refused(tmp_path):
    path = tmp_path / "scheduler_state.json"
    sched(state_path=path, margin_z=0.5).flush()
    with pytest.raises(ValueError) as refused:
        sched(state_path=path, margin_z=1.0, resume=True)
    assert "\n" not in str(refused.value) and "margin_z=0.5" in str(refused.value) and "margin_z=1" in str(refused.value)
    sched(state_path=path, margin_z=0.5, resume=True)  # the same knobs resume
