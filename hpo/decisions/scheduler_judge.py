"""The keep rule (:mod:`hpo.decisions.keep`) applied at the rungs of one
:class:`hpo.decisions.scheduler.CollapseScheduler`: a trial's prediction at a rung, the rung's
evidence, the rule's decision over the trials waiting there (sync/audit) and over one arrival
(async, or late). The decisions are written into the records by one path (``RungRecord.record``) (:mod:`hpo.decisions.scheduler_records`); when to judge, and what
Ray is told, is the scheduler's.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from predictors.curves import rung_cut
from predictors.prediction import predict_at_rungs
from hpo.decisions.keep import Candidate, KeepRule, RungEvidence, TrialEvidence, gather
from hpo.decisions.scheduler_contract import SchedulerSettings
from hpo.decisions.scheduler_records import RungDecision, RungEntry, RungRecord, TrialRecord, TrialStatus

logger = logging.getLogger("hpo.decisions.scheduler")


@dataclass
class RungJudge:
    """The scheduler's predictor, its settings (``SchedulerSettings``) and the keep rule it
    applies (``hpo.decisions.keep``)."""

    predictor: Any
    settings: SchedulerSettings
    rule: KeepRule
    strict: bool = False  # tests: a failed prediction raises instead of keeping the trial

    def __post_init__(self) -> None:
        # Trial id → its prediction at half the first rung's t̂ (the "previous look" there): made
        # once per trial, not once per arrival judged against it (async judged every recorded
        # trial again at each arrival). Rebuilt on demand after a restore.
        self._half_first: dict[str, Optional[Candidate]] = {}

    def _half_first_rung(self, recs: Sequence[TrialRecord]) -> None:
        """Each trial's prediction at half the first rung's t̂, from its own history (None:
        none), made in one batch for those not predicted there yet; only the predicted final
        is read, so the calibrated error is not computed."""
        todo = [rec for rec in recs if rec.trial_id not in self._half_first and rec.history]
        preds = predict_at_rungs(self.predictor, [tuple(zip(*rec.history)) for rec in todo],
                                       [rec.controls for rec in todo], self.settings.rungs[0] / 2, self.settings.min_points,
                                       calibrated_error=False)
        for rec, half in zip(todo, preds):
            self._half_first[rec.trial_id] = (Candidate(rec.trial_id, half.final_loss, half.loss)
                                              if half.final_loss else None)

    def recorded_settings(self) -> dict[str, Any]:
        """These settings as the state file records them (in its order); ``rule``: the rule's
        name and knobs (``KeepRule.settings``)."""
        s = self.settings
        return {"rungs": list(s.rungs), "reduction_factor": s.reduction_factor, "margin": s.margin,
                "tolerance": s.tolerance, "decision_mode": s.mode, "min_points": s.min_points,
                "rule": self.rule.settings()}

    def is_last(self, r: int) -> bool:
        return r == len(self.settings.rungs) - 1

    def margin_text(self, rung: RungRecord, short: bool = False) -> str:
        """The keep-margin ``rung`` was decided with, in words (none yet: says so)."""
        if not rung.margin_source:
            return "none yet" if short else (f"no margin applied at t̂ = {rung.fraction:g} yet (the {self.rule.name} "
                                             "rule has not ranked trials there)")
        if short:
            return f"{100 * rung.margin:.2f}%"
        return f"{100 * rung.margin:.2f}% in log-final above the predicted best at t̂ = {rung.fraction:g} " \
               f"({rung.margin_source})"

    def entry(self, rec: TrialRecord, r: int) -> RungEntry:
        """The trial's prediction at rung ``r`` (``predictors.prediction.predict_at_rungs``), as a waiting
        entry; it becomes the trial's latest prediction."""
        return self.entries([rec], r)[0]

    def entries(self, recs: Sequence[TrialRecord], r: int) -> list[RungEntry]:
        """:meth:`entry` for many trials at rung ``r``, predicted in one batch
        (``predictors.prediction.predict_at_rungs``)."""
        preds = predict_at_rungs(self.predictor, [tuple(zip(*rec.history)) for rec in recs],
                                       [rec.controls for rec in recs], self.settings.rungs[r], self.settings.min_points)
        out = []
        for rec, pred in zip(recs, preds):
            if pred.why.startswith("predictor failed"):
                logger.warning("CollapseScheduler: prediction failed for %s: %s", rec.trial_id, pred.why)
                if self.strict:
                    raise RuntimeError(pred.why)
            if pred.final_loss is not None:
                rec.latest_prediction = {"rung": self.settings.rungs[r], "train_fraction": pred.train_fraction,
                                         "final_loss": pred.final_loss, "uncertainty": pred.uncertainty}
            out.append(RungEntry(trial_id=rec.trial_id, train_fraction=float(pred.train_fraction or rec.history[-1][0]),
                                 smoothed_loss=pred.loss, n_points=pred.n_points,
                                 predicted_final_loss=pred.final_loss, uncertainty=pred.uncertainty,
                                 residual=pred.residual,
                                 reason="" if pred.final_loss is not None else f"no prediction ({pred.why})"))
        return out

    def waiting_entry(self, rec: TrialRecord, r: int) -> RungEntry:
        """A trial waiting at rung ``r`` of a sync sweep: the point it reached the rung at, not yet
        predicted; the rung's decision predicts every waiting trial in one batch (``decide``)."""
        cut = rung_cut(np.fromiter((p[0] for p in rec.history), np.float64, len(rec.history)), self.settings.rungs[r])
        n = cut if cut is not None else len(rec.history)
        t, loss = rec.history[n - 1]
        return RungEntry(trial_id=rec.trial_id, train_fraction=float(t), smoothed_loss=float(loss), n_points=n,
                         reason="waiting for the rung to be decided")

    def verdict(self, r: int, keep: bool, rec: TrialRecord) -> RungDecision:
        return RungDecision.verdict(keep, audit=self.settings.mode == "audit", last=self.is_last(r),
                                    completed=rec.status == TrialStatus.COMPLETED)

    def evidence(self, r: int, entries: Sequence[RungEntry], trials: Mapping[str, TrialRecord],
                 previous: Optional[RungRecord]) -> RungEvidence:
        """What the rule is shown at rung ``r`` (``hpo.decisions.keep.evidence.gather``): each
        trial's prediction, where it stood at the previous rung (at the first: its prediction at
        half the rung's t̂, from its own history; only for a rule that reads the sweep), its fit
        to the shape and history; the order and tolerance measured for the sweep's kind."""
        reads_sweep = self.rule.reads_previous_look
        recs = [trials[e.trial_id] for e in entries if e.trial_id in trials]
        if previous is None and reads_sweep:
            self._half_first_rung(recs)
        out = []
        for e in entries:
            rec = trials.get(e.trial_id)
            before = previous.entries.get(e.trial_id) if previous is not None else None
            prior = before.candidate() if before is not None else None
            if prior is None and previous is None and reads_sweep and rec is not None and rec.history:
                prior = self._half_first.get(rec.trial_id)
            points = rec.history if rec is not None else []
            # The points up to the rung's (t̂ increases along a history): a bisection, not a walk.
            history = tuple(points[:bisect.bisect_right(points, e.train_fraction + 1e-12, key=lambda p: p[0])])
            out.append(TrialEvidence(e.candidate(), prior, e.residual, history))
        st = self.settings
        return gather(self.predictor, st.rungs[r], out, [rec.sweep_values for rec in recs],
                      [rec.controls for rec in recs if rec.controls is not None], last=self.is_last(r),
                      reduction_factor=st.reduction_factor, margin=st.margin, tolerance=st.tolerance)

    def judge_arrival(self, rung: RungRecord, entry: RungEntry, rec: TrialRecord,
                      trials: Mapping[str, TrialRecord], now: str, compute: float,
                      previous: Optional[RungRecord] = None) -> bool:
        """An arrival at a decided rung (or any, in async mode) against the predictions recorded
        there (``KeepRule.judge_arrival``), written into its entry and the rung; True if kept."""
        r = rung.index
        recorded = [e for tid, e in rung.entries.items() if tid != rec.trial_id and not e.waiting]
        ev = self.evidence(r, [*recorded, entry], trials, previous)
        decision = self.rule.judge_arrival(ev, rec.trial_id)
        keep = rec.trial_id in decision.kept
        entry.decision = self.verdict(r, keep, rec)
        against = f" (against {len(decision.ranked) - 1} recorded)" if decision.n_keep else ""
        entry.reason = ("late arrival: " if self.settings.mode != "async" else "") + \
            decision.reason(rec.trial_id) + against
        entry.late, entry.decided_at, entry.compute_fraction = True, now, compute
        rung.record(decision, ev.kind, trials, arrival=rec.trial_id)
        return keep

    def decide(self, rung: RungRecord, participants: list[RungEntry], trials: Mapping[str, TrialRecord],
               now: str, compute: float, previous: Optional[RungRecord] = None) -> list[TrialRecord]:
        """The keep rule over the trials waiting at ``rung`` (``KeepRule.decide`` on the rung's
        evidence), written into their entries and the rung; returns the trials to stop (audit:
        none, each marked ``would_stop_at``; a finished trial is not stopped)."""
        r = rung.index
        # The waiting trials' predictions, made now in one batch (``waiting_entry``): each from
        # its history up to the rung, which waiting does not change.
        for e, fresh in zip(participants, self.entries([trials[e.trial_id] for e in participants], r)):
            e.train_fraction, e.smoothed_loss, e.n_points = fresh.train_fraction, fresh.smoothed_loss, fresh.n_points
            e.predicted_final_loss, e.uncertainty, e.residual = fresh.predicted_final_loss, fresh.uncertainty, fresh.residual
            e.reason = fresh.reason
        ev = self.evidence(r, participants, trials, previous)
        decision = self.rule.decide(ev)
        to_stop: list[TrialRecord] = []
        kept = set(decision.kept)  # a membership test per participant: a set, not the list
        for e in participants:
            rec = trials[e.trial_id]
            keep = e.trial_id in kept
            e.decision = self.verdict(r, keep, rec)
            reason = decision.reason(e.trial_id, derivation=False)  # the rung's margin_source has it
            if e.predicted_final_loss is None:
                reason = f"{e.reason}; kept" if e.reason else reason
            e.reason = reason + ("; already completed" if e.decision == RungDecision.COMPLETED else "")
            e.decided_at, e.compute_fraction = now, compute
            if not keep and self.settings.mode == "audit":
                rec.would_stop_at = rung.fraction
            elif not keep and rec.status != TrialStatus.COMPLETED:
                to_stop.append(rec)
        rung.record(decision, ev.kind, trials, participants=len(participants), now=now, compute=compute)
        return to_stop
