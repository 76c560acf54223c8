"""The persisted state of :class:`hpo.decisions.scheduler.CollapseScheduler`: ``scheduler_state.json``.

Ray Tune does not checkpoint scheduler state (``TuneController.save_to_dir`` saves the
search algorithm and callbacks only), so the scheduler keeps everything it needs to
resume, and everything a report needs to explain its decisions, in one JSON file:

* per trial (:class:`TrialRecord`): config, controls, the (t̂, loss) history, status,
  the rung it was stopped at, the final metric;
* per rung (:class:`RungRecord`): the decision log, one :class:`RungEntry` per trial
  judged there (loss at the rung, t̂ used, predicted final loss ± uncertainty, decision,
  human-readable reason), plus who was predicted-best and current-best and how much of
  the sweep's compute had been spent when the rung was decided;
* the early answer, once the last rung is decided.

The snapshot is written atomically (``predictors.io``: a temporary file, then
``os.replace``), so a crash leaves either the old or the new version; non-finite floats are
written as ``null`` so it stays strict JSON. The curves are not in the snapshot the scheduler
writes: every (trial, t̂, loss) it takes is appended to ``scheduler_state.history.jsonl``
(:class:`HistoryLog`) and :meth:`SchedulerState.load` replays it, so persisting a decision
costs the same at t̂ = 0.1 and at t̂ = 0.9, and does not grow with the curves.

The schema (``version`` 2; version-1 files, with histories inline, still load) is in
``docs/design.md`` ("scheduler_state.json").

Trial ``status`` is a :class:`~hpo.decisions.scheduler_records.TrialStatus`, entry ``decision`` a
:class:`~hpo.decisions.scheduler_records.RungDecision` (``hpo.decisions.scheduler_records`` holds the records).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from hpo.decisions.keep.collapse import DEFAULT_MARGIN_Z
from predictors.curves import compute_fraction
from predictors.kinds import sweep_values
from hpo.decisions.scheduler_contract import flat

from hpo.decisions.scheduler_records import (  # noqa: F401 - the records are re-exported: one import for readers
    TERMINAL_STATUSES, RungDecision, RungEntry, RungRecord, TrialRecord,
    TrialStatus, _as_is, _plain_json, _str_keys, verdict)
from predictors.curves import T_HAT_EPS
from predictors.io import atomic_write_text, finite_or_none, json_safe  # noqa: F401 - finite_or_none re-exported

SCHEMA_VERSION = 2
#: A throttled state write waits at least this many times as long as the last write took.
PERSIST_SHARE = 20

logger = logging.getLogger("hpo.decisions.scheduler")


#: The top-level keys of a state file (versions 1 and 2).
STATE_KEYS = ("version", "experiment_id", "settings", "history_file", "trials", "rungs", "early_answer", "updated_at")


class StateFileError(ValueError):
    """``scheduler_state.json`` could not be read; the message names the file."""


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string (second resolution)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def rule_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The keep rule's name and knobs as a state's ``settings`` record them (``KeepRule.settings``;
    a state written before the rule recorded its knobs: its name, and ``margin_z`` for collapse)."""
    rule = settings.get("rule") or "collapse"
    if isinstance(rule, Mapping):
        return dict(rule)
    return {"name": rule, **({"margin_z": settings.get("margin_z", DEFAULT_MARGIN_Z)} if rule == "collapse" else {})}


def same_rule(recorded: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
    """The same rule with the same knobs (a knob one of them does not record is not compared:
    a state written before the rule recorded it)."""
    return recorded.get("name") == rule.get("name") and all(recorded[k] == rule[k] for k in set(recorded) & set(rule))


def rule_words(rule: Mapping[str, Any]) -> str:
    """``collapse (margin_z=0.5, read_sweep=True)``."""
    knobs = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in rule.items() if k != "name")
    return f"{rule.get('name')} ({knobs})" if knobs else str(rule.get("name"))


@dataclass
class SchedulerState:
    """Everything in ``scheduler_state.json``.

    Attributes:
        settings: the scheduler's settings when the state was written (checked on restore).
        trials: :class:`TrialRecord` by trial id.
        rungs: one :class:`RungRecord` per rung, in rung order.
        early_answer: the early-answer dict once the last rung is decided, else None.
        version: schema version (:data:`SCHEMA_VERSION`).
        updated_at: ISO time of the last write.
    """

    settings: dict[str, Any] = field(default_factory=dict)
    trials: dict[str, TrialRecord] = field(default_factory=dict)
    rungs: list[RungRecord] = field(default_factory=list)
    early_answer: Optional[dict[str, Any]] = None
    version: int = SCHEMA_VERSION
    updated_at: Optional[str] = None
    experiment_id: str = ""

    def to_dict(self, with_history: bool = True, safe: bool = True) -> dict[str, Any]:
        """The state as JSON values (``safe``: strict JSON, as ``json_safe`` makes it; else the
        records' values as they are, for :func:`_plain_json`)."""
        convert = json_safe if safe else _as_is
        return {
            "version": self.version,
            "experiment_id": self.experiment_id,
            "settings": convert(self.settings),
            # Without histories, the snapshot says where they are (an append-only log).
            "history_file": None if with_history else HISTORY_SUFFIX,
            "trials": {tid: rec.to_dict(with_history, safe) for tid, rec in self.trials.items()},
            "rungs": [r.to_dict(safe) for r in self.rungs],
            "early_answer": convert(self.early_answer),
            "updated_at": self.updated_at,
        }

    def to_json(self, indent: Optional[int] = None, with_history: bool = True) -> str:
        # Compact by default: json's C encoder runs only without indent (5x faster at 1,000
        # trials), and first without the walk that makes every value safe (4x faster again at
        # 10,000): the same text whenever that walk would have changed nothing. The ~30,000
        # short-lived dicts it builds at 10,000 trials set off cyclic collections that walk
        # every object of the sweep and free nothing (~0.2 s a snapshot): paused meanwhile.
        paused = gc.isenabled()
        gc.disable()
        try:
            if indent is None and all(_str_keys(rec.config) for rec in self.trials.values()):
                text = _plain_json(self.to_dict(with_history, safe=False))
                if text is not None:
                    return text
            return json.dumps(self.to_dict(with_history), indent=indent, allow_nan=False, ensure_ascii=False,
                              separators=(",", ":") if indent is None else None)
        finally:
            if paused:
                gc.enable()

    # ------------------------------------------------------------ checks and read-only views

    def check_compatible(self, settings: dict[str, Any], source: str) -> None:
        """Raise ``ValueError`` naming ``source`` when this state was written with other rungs,
        another decision mode or another metric than ``settings`` (a scheduler's)."""
        old = self.settings
        old_rungs = [float(r) for r in old.get("rungs", [])]
        rungs = [float(r) for r in settings["rungs"]]
        if len(old_rungs) != len(rungs) or any(abs(a - b) > 1e-9 for a, b in zip(old_rungs, rungs)):
            raise ValueError(f"{source}: state was written with rungs {old_rungs}, not {rungs}")
        if old.get("decision_mode") != settings["decision_mode"]:
            raise ValueError(f"{source}: state was written in decision mode {old.get('decision_mode')!r}, "
                             f"not {settings['decision_mode']!r}")
        if old.get("metric") and settings.get("metric") and old["metric"] != settings["metric"]:
            raise ValueError(f"{source}: state was written with metric={old['metric']!r}, not {settings['metric']!r}")
        old_rule, rule = rule_settings(old), rule_settings(settings)
        if not same_rule(old_rule, rule):
            raise ValueError(f"{source}: state was written with rule {rule_words(old_rule)}, not {rule_words(rule)}; "
                             "resume with the rule settings it was started with")
        if len(self.rungs) != len(rungs) or any(r.index != i for i, r in enumerate(self.rungs)):
            raise ValueError(f"{source}: state has {len(self.rungs)} rung records for {len(rungs)} rungs")

    def eliminated(self, rec: TrialRecord) -> bool:
        """Out of the rung competition: stopped, diverged, errored or (audit) would have been stopped."""
        return rec.halted or (self.settings.get("decision_mode") == "audit" and rec.would_stop_at is not None)

    def live(self, rec: TrialRecord) -> bool:
        """Still running (or waiting to) and in the rung competition."""
        return rec.alive and not self.eliminated(rec)

    def may_run(self, trial_id: str, sync: bool) -> bool:
        """Ray may run the trial: unknown here, or neither ended by the scheduler nor (sync)
        waiting at an undecided rung."""
        rec = self.trials.get(trial_id)
        return rec is None or not (rec.out or (sync and self.waiting_rung(trial_id) is not None))

    def waiting_rung(self, trial_id: str) -> Optional[RungRecord]:
        """The undecided rung the trial waits at (sync mode pauses it there), or None."""
        return next((rung for rung in self.rungs if rung.waiting(trial_id)), None)

    def between_rungs(self, rec: TrialRecord) -> bool:
        """The trial waits at no undecided rung and has not reached the next rung it has no
        entry at: a result can change nothing but its history (the fast path)."""
        t = rec.history[-1][0]
        for rung in self.rungs:
            entry = rung.entries.get(rec.trial_id)
            if entry is None or entry.decision == RungDecision.REMOVED:
                return t < rung.fraction - T_HAT_EPS
            if rung.waiting(rec.trial_id):
                return False
        return True

    def compute_fraction(self) -> float:
        """Σ_i t̂_i·N_i·D_i / Σ_i N_i·D_i over all trials (:func:`predictors.curves.compute_fraction`)."""
        recs = self.trials.values()
        return compute_fraction({r.trial_id: r.last_train_fraction for r in recs},
                                      {r.trial_id: (r.n_params or 0) * (r.total_tokens or 0) for r in recs},
                                      {r.trial_id: r.redone for r in recs})

    def progress(self) -> list[dict[str, Any]]:
        """Per rung: ``fraction``, ``decided``, and how many trials ``reached`` it, are
        ``alive`` past it (kept and not stopped), were ``stopped`` there and ``finished``."""
        return [{"fraction": rung.fraction, "decided": rung.decided, "reached": len(rung.entries),
                 "alive": sum(1 for t in rung.survivors if self.live(self.trials[t])),
                 "stopped": sum(1 for rec in self.trials.values() if rec.stopped_at == rung.fraction),
                 "finished": sum(1 for t in rung.survivors if self.trials[t].status == TrialStatus.COMPLETED)}
                for rung in self.rungs]

    # ------------------------------------------------------------ state transitions

    def reconcile(self, rec: TrialRecord, ray: TrialStatus) -> bool:
        """Take what Ray says of a known trial (re-added on restore or retry); True when it is
        alive again (retried after a failure, or resumed with ``resume_errored``)."""
        if rec.status == TrialStatus.ERROR and ray.alive:
            rec.status = TrialStatus.PENDING
            return True
        if rec.alive and ray == TrialStatus.COMPLETED:
            self.complete(rec, keep_final=True)  # it finished before our last write
        elif rec.alive and ray == TrialStatus.ERROR:
            rec.status = TrialStatus.ERROR
        return False

    @staticmethod
    def complete(rec: TrialRecord, keep_final: bool = False) -> None:
        """Ran to its end: its final metric is its last point (or the one already recorded)."""
        rec.status = TrialStatus.COMPLETED
        if not (keep_final and rec.final_metric is not None):
            rec.final_metric = rec.history[-1][1] if rec.history else None

    @staticmethod
    def stop(rec: TrialRecord, fraction: float) -> None:
        rec.status, rec.stopped_at = TrialStatus.STOPPED, fraction

    @staticmethod
    def diverge(rec: TrialRecord, t: float) -> None:
        rec.status, rec.diverged_at, rec.last_train_fraction = TrialStatus.DIVERGED, t, t

    def add_trial(self, trial_id: str, config: dict[str, Any],
                  ray: Optional[TrialStatus]) -> tuple[TrialRecord, bool]:
        """Register a trial Ray added (``ray``: its status there), or take what Ray says of a
        known one (re-added on restore or retry: :meth:`reconcile`). The record, and whether it
        may now block a rung it did not (new, or alive again)."""
        rec = self.trials.get(trial_id)
        if rec is None:
            config = json_safe(config)
            rec = self.trials[trial_id] = TrialRecord(
                trial_id=trial_id, order=len(self.trials), config=config, status=ray or TrialStatus.PENDING,
                sweep_values=sweep_values(flat(config)))
            return rec, True
        return rec, ray is not None and self.reconcile(rec, ray)

    def take_point(self, rec: TrialRecord, t: float, value: float) -> tuple[bool, bool]:
        """Append (t̂, loss) to the trial's history. A rewind (restored from an earlier
        checkpoint, or restarted: a trainable without checkpoints begins again after every
        PAUSE) drops the later points and the undecided rung entries made from them; the
        repeated work counts in compute. Returns (rewound, an entry was dropped)."""
        if not rec.add_point(t, value, T_HAT_EPS):
            return False, False
        return True, self.drop_rewound(rec, t)

    def drop_rewound(self, rec: TrialRecord, t: float) -> bool:
        """The trial went back to t̂ = ``t`` (restored from an earlier checkpoint, or restarted):
        its undecided rung entries made from the dropped points go too; True if any did."""
        dropped = False
        for rung in self.rungs:
            entry = rung.entries.get(rec.trial_id)
            if entry is not None and entry.waiting and entry.train_fraction > t + T_HAT_EPS:
                del rung.entries[rec.trial_id]
                dropped = True
        return dropped

    def remove_halted(self, rung: RungRecord, now: str, compute: float) -> list[RungEntry]:
        """Close the entries of trials that left the sweep while waiting at ``rung`` (except in
        audit mode, where nothing leaves); the entries still waiting, to be judged."""
        audit = self.settings.get("decision_mode") == "audit"
        participants: list[RungEntry] = []
        for e in (e for e in rung.entries.values() if e.waiting):
            rec = self.trials[e.trial_id]
            if not audit and rec.halted:
                e.decision, e.reason = RungDecision.REMOVED, f"trial {rec.status} before the rung was decided"
                e.decided_at, e.compute_fraction = now, compute
            else:
                participants.append(e)
        return participants

    def verdict(self, trial_id: str) -> str:
        """``completed``, ``stopped_at_<fraction>``, ``diverged``, ``error``, ``stopped``,
        ``running``, ``paused``, ``pending`` or ``unknown``."""
        rec = self.trials.get(trial_id)
        if rec is None:
            return "unknown"
        return verdict(rec.status, rec.stopped_at)

    def summary(self, compute_fraction: float) -> dict[str, Any]:
        """A JSON-safe snapshot for progress displays: ``decision_mode``, ``metric``, ``mode``,
        ``rungs``, ``trials`` (by id: ``status``, ``verdict``, ``train_fraction``, ``loss``,
        ``predicted_final_loss``, ``uncertainty``, ``prediction_rung``, ``stopped_at``,
        ``would_stop_at``, ``final_metric``, ``config``), ``rung_status`` (per rung: ``fraction``,
        ``decided``, ``n_reached``, ``n_participants``, ``survivors``, ``predicted_best``,
        ``current_best``, ``compute_fraction``, ``margin``, ``kind``), ``predicted_best`` (among
        trials still in the race, the best prediction at the highest rung reached),
        ``current_best`` (lowest latest metric among trials not out), ``compute_fraction`` and
        ``early_answer``."""
        recs = sorted(self.trials.values(), key=lambda rec: rec.order)
        trials = {rec.trial_id: {
            "status": str(rec.status), "verdict": self.verdict(rec.trial_id),
            "train_fraction": rec.last_train_fraction, "loss": rec.history[-1][1] if rec.history else None,
            "predicted_final_loss": (rec.latest_prediction or {}).get("final_loss"),
            "uncertainty": (rec.latest_prediction or {}).get("uncertainty"),
            "prediction_rung": (rec.latest_prediction or {}).get("rung"), "stopped_at": rec.stopped_at,
            "would_stop_at": rec.would_stop_at, "final_metric": rec.final_metric, "config": rec.config,
        } for rec in recs}
        rung_status = [{
            "fraction": rung.fraction, "decided": rung.decided, "n_reached": len(rung.entries),
            "n_participants": rung.n_participants, "survivors": list(rung.survivors),
            "predicted_best": rung.predicted_best, "current_best": rung.current_best,
            "compute_fraction": rung.compute_fraction, "margin": rung.margin, "kind": rung.kind,
        } for rung in self.rungs]
        predicted_best = None
        in_race = [rec for rec in recs if rec.latest_prediction and not self.eliminated(rec)]
        if in_race:
            pos = {r.fraction: i for i, r in enumerate(self.rungs)}
            best = min(in_race, key=lambda rec: (-pos.get(rec.latest_prediction["rung"], -1),  # type: ignore[index]
                                                 rec.latest_prediction["final_loss"], rec.order))  # type: ignore[index]
            lp = best.latest_prediction or {}
            predicted_best = {"trial_id": best.trial_id, "predicted_final_loss": lp["final_loss"],
                              "uncertainty": lp["uncertainty"], "rung": lp["rung"]}
        alive = [rec for rec in recs if rec.history and not rec.halted]
        current = min(alive, key=lambda rec: (rec.history[-1][1], rec.order)) if alive else None
        return json_safe({
            "decision_mode": self.settings.get("decision_mode"), "metric": self.settings.get("metric"),
            "mode": self.settings.get("mode"), "rungs": [r.fraction for r in self.rungs], "trials": trials,
            "rung_status": rung_status, "predicted_best": predicted_best,
            "current_best": None if current is None else {
                "trial_id": current.trial_id, "loss": current.history[-1][1],
                "train_fraction": current.history[-1][0]},
            "compute_fraction": compute_fraction, "early_answer": self.early_answer,
        })

    def debug_string(self) -> str:
        """One header line, then a line per rung: decided? survivors."""
        st, recs = self.settings, list(self.trials.values())
        count = {s: sum(r.status == s for r in recs) for s in TrialStatus if s.terminal}
        margin = st.get("margin")
        lines = [f"Using CollapseScheduler ({st.get('decision_mode')}; {st.get('metric')} {st.get('mode')}; "
                 f"rf={st.get('reduction_factor', 0):g}; margin={margin}; rule {rule_words(rule_settings(st))}): "
                 f"{len(recs)} trials, {count['stopped']} stopped, {count['diverged']} diverged, "
                 f"{count['completed']} completed, {count['error']} errored"]
        live = sum(1 for r in recs if self.live(r))
        for rung in self.rungs:
            if rung.decided:
                state = (f"decided, kept {len(rung.survivors)}/{rung.n_participants} "
                         f"[{', '.join(rung.survivors)}], predicted best {rung.predicted_best}")
            elif st.get("decision_mode") == "async":
                kept = sum(e.decision in (RungDecision.CONTINUE, RungDecision.KEEP) for e in rung.entries.values())
                state = f"{len(rung.entries)} judged, {kept} kept"
            else:
                state = f"waiting ({len(rung.entries)} reached, {live} live)"
            lines.append(f"  rung {rung.fraction:g}: {state}")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<state>") -> "SchedulerState":
        """Build from a parsed dict; any problem raises :class:`StateFileError` naming ``source``."""
        try:
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            version = data.get("version")
            if version not in (1, SCHEMA_VERSION):
                raise ValueError(f"unsupported version {version!r} (this code reads 1 and {SCHEMA_VERSION})")
            # A file of another layout under a known version number (another tool's, a later
            # one's) would load as an empty state and be overwritten on resume: refused instead.
            unknown = sorted(set(data) - set(STATE_KEYS))
            if unknown or "trials" not in data:
                what = f"unknown keys {unknown[:5]}" if unknown else "no 'trials'"
                raise ValueError(f"version {version!r} but not its layout ({what}); left unchanged")
            trials_raw = data.get("trials") or {}
            rungs_raw = data.get("rungs") or []
            if not isinstance(trials_raw, dict) or not isinstance(rungs_raw, list):
                raise ValueError("'trials' must be an object and 'rungs' a list")
            trials = {str(tid): TrialRecord.from_dict(rec) for tid, rec in trials_raw.items()}
            for tid, rec in trials.items():
                if rec.trial_id != tid:
                    raise ValueError(f"trial key {tid!r} does not match its trial_id {rec.trial_id!r}")
            return cls(
                settings=dict(data.get("settings") or {}),
                trials=trials,
                rungs=[RungRecord.from_dict(r) for r in rungs_raw],
                early_answer=data.get("early_answer"),
                version=SCHEMA_VERSION,
                updated_at=data.get("updated_at"),
                experiment_id=str(data.get("experiment_id") or ""),
            )
        except StateFileError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise StateFileError(f"{source}: malformed scheduler state: {exc}") from exc

    @classmethod
    def from_json(cls, text: str, source: str = "<state>") -> "SchedulerState":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateFileError(f"{source}: not valid JSON: {exc}") from exc
        return cls.from_dict(data, source=source)

    @classmethod
    def load(cls, path: Union[str, Path]) -> "SchedulerState":
        """Read ``path`` (and, for a snapshot, replay its history log); a missing, unreadable or
        malformed file raises :class:`StateFileError`."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise StateFileError(f"{path}: cannot read scheduler state: {exc}") from exc
        except UnicodeDecodeError:
            raise StateFileError(f"{path}: not a scheduler state file (not UTF-8 text; a binary file?)") from None
        state = cls.from_json(text, source=str(path))
        if json.loads(text).get("history_file"):
            HistoryLog(history_path(path)).replay_into(state)
        return state

    def save(self, path: Union[str, Path], with_history: bool = True) -> None:
        """Write atomically (``predictors.io``); ``with_history=False`` writes the snapshot the
        scheduler keeps beside its append-only :class:`HistoryLog`."""
        self.updated_at = utc_now()
        atomic_write_text(path, self.to_json(with_history=with_history))


#: The history log of a state file ``scheduler_state.json`` is ``scheduler_state.history.jsonl``.
HISTORY_SUFFIX = ".history.jsonl"


def history_path(state_path: Union[str, Path]) -> Path:
    state_path = Path(state_path)
    return state_path.with_name(state_path.stem + HISTORY_SUFFIX)


class HistoryLog:
    """The append-only log of every (trial id, t̂, loss) the scheduler has taken, one JSON line
    each. A rung decision rewrites only the (history-free) snapshot, so the cost of persisting
    does not grow with the length of the curves; lines are buffered and written (flushed, not
    fsynced: a killed driver loses nothing the OS has) before every snapshot."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._buffer: list[str] = []
        self._names: dict[str, str] = {}  # trial id -> its JSON string
        self._tail_checked = False  # whether the file's last line (a killed writer's) was checked

    def append(self, trial_id: str, t: float, value: float) -> None:
        # json.dumps([trial_id, t, value]) written out (a call per result was a tenth of the
        # driver's time between rungs): floats are written by repr, as json writes them.
        name = self._names.get(trial_id)
        if name is None:
            name = self._names[trial_id] = json.dumps(trial_id)
        self._buffer.append(f"[{name}, {float(t)!r}, {float(value)!r}]\n")

    def flush(self, start: bool = False) -> None:
        """Write the buffered lines; ``start`` truncates the file first (a new experiment)."""
        if not self._buffer and not start:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A driver killed during a write leaves its last line cut short, without its newline:
        # the first line appended after a resume would be glued to it and lost with it at the
        # next replay. End the torn line first (replay skips it, as it did before).
        torn = not start and not self._tail_checked and self._ends_torn()
        self._tail_checked = True
        with open(self.path, "w" if start else "a", encoding="utf-8") as handle:
            handle.write(("\n" if torn else "") + "".join(self._buffer))
        self._buffer.clear()

    def _ends_torn(self) -> bool:
        """The file exists and does not end with a newline (its last write was cut)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(0, 2)
                if handle.tell() == 0:
                    return False
                handle.seek(-1, 2)
                return handle.read(1) != b"\n"
        except OSError:
            return False

    def replay_into(self, state: "SchedulerState") -> None:
        """Rebuild every trial's history from the log (a torn last line is ignored)."""
        if not self.path.exists():
            return
        for rec in state.trials.values():
            rec.history = []
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    tid, t, value = json.loads(line)
                except (ValueError, TypeError):
                    continue  # a line cut short by a kill
                rec = state.trials.get(tid)
                if rec is None:
                    rec = state.trials[tid] = TrialRecord(trial_id=tid, order=len(state.trials))
                rec.add_point(float(t), float(value))
        for rec in state.trials.values():
            if rec.status == TrialStatus.DIVERGED and rec.diverged_at is not None:
                rec.last_train_fraction = max(rec.last_train_fraction, rec.diverged_at)


class StateStore:
    """Where a scheduler keeps its state: the snapshot at ``path`` (written atomically, without
    curves) and the history log beside it. A decision is written at once (``force``); other
    changes at most every ``interval_s``, and at most ~1/:data:`PERSIST_SHARE` of the driver's
    time however large the sweep (a 10,000-trial snapshot takes ~0.5 s to write)."""

    def __init__(self, path: Optional[Path], interval_s: float) -> None:
        self.path = path
        self.interval_s = float(interval_s)
        self.started = False  # a fresh experiment truncates a stale history log once
        self.last_save = 0.0
        self.reopen()

    def reopen(self) -> None:
        """A new history buffer and write timing (on construction, and once unpickled)."""
        self.history = HistoryLog(history_path(self.path)) if self.path is not None else None
        self.save_s = 0.0  # how long the last write took

    def append(self, trial_id: str, t: float, value: float) -> None:
        if self.history is not None:
            self.history.append(trial_id, t, value)

    def save(self, state: SchedulerState, force: bool = False, strict: bool = False) -> None:
        """Write the state (throttled unless ``force``). Never raises unless ``strict``: a failed
        write is logged and must not kill the sweep."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self.last_save < max(self.interval_s, self.save_s * PERSIST_SHARE):
            return
        try:
            if self.history is not None:
                self.history.flush(start=not self.started)
                self.started = True
            state.save(self.path, with_history=False)
            self.last_save = time.monotonic()
            self.save_s = self.last_save - now
        except Exception:  # noqa: BLE001 - a failed write must not kill the sweep
            logger.exception("CollapseScheduler: could not write %s", self.path)
            if strict:
                raise

    def check_start(self, resume: bool) -> bool:
        """Whether a new scheduler continues the state at ``path`` (``resume``); a ValueError when
        there is none to resume, or one that is another experiment's and ``resume`` is not set."""
        exists = self.path is not None and self.path.exists()
        if exists and not resume:
            other = SchedulerState.load(self.path).experiment_id or "unknown"  # type: ignore[arg-type]
            raise ValueError(f"state_path: {self.path} holds the state of experiment {other}; "
                             "pass resume=True to continue it, or give a new path")
        if resume and not exists:
            raise ValueError(f"resume: there is no state to resume at {self.path}")
        return resume

    def load(self, settings: dict[str, Any], experiment_id: Optional[str]) -> SchedulerState:
        """The state at ``path``, checked against ``settings``; ``experiment_id`` (None: adopt
        whichever experiment it holds) must be the one it was written by."""
        assert self.path is not None
        state = SchedulerState.load(self.path)
        # A driver killed during a snapshot write leaves its temporary file (the snapshot itself
        # is the old one or the new one, never half): one driver per folder, so none is in use.
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        state.check_compatible(settings, str(self.path))
        if experiment_id is not None and state.experiment_id and state.experiment_id != experiment_id:
            raise ValueError(f"{self.path}: holds experiment {state.experiment_id}, not this scheduler's "
                             f"{experiment_id}")
        self.started = True
        return state


class RungWalk:
    """Which rungs no live trial has yet to reach, without a walk over every trial per result
    (that made a 10,000-trial sweep quadratic). Per rung, a cursor over the trials in creation
    order: trials before it neither block the rung nor can again until :meth:`reopen` moves it
    back (amortised O(1) per call)."""

    def __init__(self, n_rungs: int) -> None:
        self.ids: list[str] = []
        self.cursor = [0] * n_rungs

    def reindex(self, state: SchedulerState) -> None:
        """Rebuild for a state loaded from a file."""
        self.ids = [rec.trial_id for rec in sorted(state.trials.values(), key=lambda rec: rec.order)]
        self.cursor = [0] * len(self.cursor)

    def add(self, rec: TrialRecord) -> None:
        if len(self.ids) == rec.order:
            self.ids.append(rec.trial_id)

    def reopen(self, rec: Optional[TrialRecord]) -> None:
        """The trial may block a rung again (alive again, or an entry of it dropped): move the
        cursors back to it. O(rungs); the walk from there is paid once."""
        if rec is None:
            return
        for r, cursor in enumerate(self.cursor):
            if rec.order < cursor:
                self.cursor[r] = rec.order

    @staticmethod
    def blocks(state: SchedulerState, rec: TrialRecord, rung: RungRecord) -> bool:
        """A live trial with no (or a removed) entry at the rung: the rung must wait for it."""
        if not state.live(rec):
            return False
        entry = rung.entries.get(rec.trial_id)
        return entry is None or entry.decision == RungDecision.REMOVED

    def ready(self, state: SchedulerState, r: int, check: bool = False) -> bool:
        """Rung ``r`` is undecided, someone waits at it, and no live trial has yet to reach it
        (``check``: assert that the walk agrees with that definition, for tests)."""
        rung = state.rungs[r]
        if rung.decided or not any(e.waiting for e in rung.entries.values()):
            return False
        if len(self.ids) != len(state.trials):
            self.reindex(state)
        ids, trials, i = self.ids, state.trials, self.cursor[r]
        while i < len(ids) and not self.blocks(state, trials[ids[i]], rung):
            i += 1
        self.cursor[r] = i
        if check:
            assert (i == len(ids)) == all(not self.blocks(state, rec, rung) for rec in trials.values()), "rung walk"
        return i == len(ids)
