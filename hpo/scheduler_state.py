"""The persisted state of :class:`hpo.scheduler.CollapseScheduler`: ``scheduler_state.json``.

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

Schema (``version`` 2; version-1 files, with histories inline, still load)::

    {
      "version": 2, "experiment_id": "<hex>", "history_file": ".history.jsonl" | null,
      "settings": {"metric", "mode", "time_attr", "rungs", "reduction_factor",
                   "margin", "margin_z", "decision_mode", "min_points"},
      "trials": {trial_id: {"trial_id", "order", "config", "controls", "history": [[t, loss], ...]
                            (only when "history_file" is null), "status", "stopped_at",
                            "would_stop_at", "diverged_at", "final_metric", "last_train_fraction",
                            "n_params", "total_tokens", "latest_prediction": {"rung",
                            "train_fraction", "final_loss", "uncertainty"} | null, "sweep_values"}},
      "rungs": [{"index", "fraction", "decided", "decided_at", "n_participants", "n_keep",
                 "margin", "margin_source", "kind", "order_weight", "kept_all", "survivors", "predicted_best",
                 "current_best", "compute_fraction",
                 "entries": {trial_id: {"trial_id", "train_fraction", "smoothed_loss",
                                        "n_points", "predicted_final_loss", "uncertainty",
                                        "decision", "reason", "late", "decided_at",
                                        "compute_fraction"}}}],
      "early_answer": {...} | null,
      "updated_at": "<ISO 8601 UTC>"
    }

Trial ``status`` is one of :data:`TRIAL_STATUSES`; entry ``decision`` one of
:data:`DECISIONS`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from predictors.controls import Controls
from predictors.io import atomic_write_text, finite_or_none, json_safe  # noqa: F401 - finite_or_none re-exported

SCHEMA_VERSION = 2

#: Trial statuses as the scheduler sees them.
TRIAL_STATUSES = ("pending", "running", "paused", "completed", "stopped", "diverged", "error")
#: Statuses after which a trial takes no further part in any rung.
TERMINAL_STATUSES = frozenset({"completed", "stopped", "diverged", "error"})
#: Terminal statuses of a trial that left the sweep without finishing.
HALTED_STATUSES = frozenset({"stopped", "diverged", "error"})
#: Decisions in the rung log. ``pending``: reached an undecided rung; ``continue``: kept at an
#: intermediate rung; ``keep``: kept at the last rung; ``stop``: stopped; ``would_*``: audit
#: mode; ``completed``: finished before the rung was decided, nothing left to stop;
#: ``removed``: left the sweep (error, removal, divergence) before the rung was decided.
DECISIONS = ("pending", "continue", "keep", "stop", "would_keep", "would_stop", "completed", "removed")


class StateFileError(ValueError):
    """``scheduler_state.json`` could not be read; the message names the file."""


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string (second resolution)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def _opt_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class RungEntry:
    """One trial judged at one rung (a line of the decision log).

    Attributes:
        trial_id: the Ray trial id.
        train_fraction: the t̂ of the first result at or past the rung (the point used).
        smoothed_loss: the reported (smoothed) metric at that point.
        n_points: history points used for the prediction.
        predicted_final_loss: the predictor's final loss, or None if it could not predict.
        uncertainty: one standard deviation of ``predicted_final_loss``.
        decision: one of :data:`DECISIONS`.
        reason: a human-readable explanation of the decision.
        late: True when judged after the rung had been decided (against the recorded
            predictions, as ASHA does), or in async mode.
        decided_at: ISO time of the decision.
        compute_fraction: the sweep's compute fraction spent when decided.
    """

    trial_id: str
    train_fraction: float
    smoothed_loss: Optional[float]
    n_points: int = 0
    predicted_final_loss: Optional[float] = None
    uncertainty: Optional[float] = None
    decision: str = "pending"
    reason: str = ""
    late: bool = False
    decided_at: Optional[str] = None
    compute_fraction: Optional[float] = None

    def to_dict(self, safe: bool = True) -> dict[str, Any]:
        return _safe_fields(self, _field_names(type(self)), safe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RungEntry":
        entry = cls(**_known(cls, data))
        entry.train_fraction = float(entry.train_fraction)
        entry.smoothed_loss = _opt_float(entry.smoothed_loss)
        entry.predicted_final_loss = _opt_float(entry.predicted_final_loss)
        entry.uncertainty = _opt_float(entry.uncertainty)
        if entry.decision not in DECISIONS:
            raise ValueError(f"rung entry {entry.trial_id}: unknown decision {entry.decision!r}")
        return entry


@dataclass
class RungRecord:
    """The decision log of one rung.

    Attributes:
        index: position in the scheduler's rung list.
        fraction: the decision fraction t̂ of this rung.
        decided: True once the rung's (sync or audit) decision has been made. Async mode
            decides trial by trial and leaves this False.
        decided_at: ISO time of the decision.
        n_participants: trials ranked at the decision.
        n_keep: how many the rule kept (⌈n/rf⌉ at intermediate rungs; at the last rung the
            predicted best plus those within the margin).
        margin: the keep-margin used at this rung, in log-final units (0.02 ≈ 2% above the
            predicted best; ``hpo.rules``).
        margin_source: where the margin came from, in words (the ranking error of which kind
            of sweep, or a fixed margin).
        kind: the kind of sweep the participants formed (``hpo.rules.sweep_kind``).
        order_weight: the order the rung ranked by (``hpo.rules.score``: 1 = the predicted
            finals, 0 = the losses at the rung, between: their blend).
        kept_all: True when the spread of all predicted finals was within the margin and
            everyone was kept.
        survivors: ids of the trials kept at the decision (late arrivals append).
        predicted_best: id of the trial with the best predicted final loss at the rung.
        current_best: id of the trial with the best smoothed loss at the rung.
        compute_fraction: Σ t̂_i·N_i·D_i / Σ N_i·D_i when the rung was decided.
        entries: one :class:`RungEntry` per trial that reached the rung, by trial id.
    """

    index: int
    fraction: float
    decided: bool = False
    decided_at: Optional[str] = None
    n_participants: int = 0
    n_keep: int = 0
    margin: float = 0.0
    margin_source: str = ""
    kind: str = ""
    order_weight: float = 1.0
    kept_all: bool = False
    survivors: list[str] = field(default_factory=list)
    predicted_best: Optional[str] = None
    current_best: Optional[str] = None
    compute_fraction: Optional[float] = None
    entries: dict[str, RungEntry] = field(default_factory=dict)

    def to_dict(self, safe: bool = True) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "entries"}
        if safe:
            data = json_safe(data)
        data["entries"] = {tid: e.to_dict(safe) for tid, e in self.entries.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RungRecord":
        raw = dict(data)
        entries = raw.pop("entries", {}) or {}
        rung = cls(**_known(cls, raw))
        rung.fraction = float(rung.fraction)
        rung.margin = float(rung.margin or 0.0)
        rung.margin_source, rung.kind = str(rung.margin_source or ""), str(rung.kind or "")
        rung.kept_all = bool(rung.kept_all)
        rung.order_weight = float(1.0 if rung.order_weight is None else rung.order_weight)
        rung.survivors = [str(s) for s in rung.survivors or []]
        rung.compute_fraction = _opt_float(rung.compute_fraction)
        rung.entries = {str(tid): RungEntry.from_dict(e) for tid, e in entries.items()}
        return rung


@dataclass
class TrialRecord:
    """What the scheduler knows about one trial.

    Attributes:
        trial_id: the Ray trial id (stable across ``Tuner.restore``).
        order: the order in which the scheduler first saw the trial.
        config: ``trial.config``, JSON-safe.
        controls: the trial's :class:`predictors.Controls` (read once from its results and
            config), or None until a result carries them; kept typed in memory and written as
            ``Controls.to_dict()`` in the state file.
        history: ``[[t̂, loss], ...]`` of finite results, t̂ non-decreasing.
        status: one of :data:`TRIAL_STATUSES`.
        stopped_at: the rung fraction at which the scheduler stopped the trial.
        would_stop_at: audit mode: the rung fraction at which sync mode would have stopped it.
        diverged_at: t̂ of the non-finite (or ``diverged=True``) result.
        final_metric: the last finite metric of a completed trial.
        last_train_fraction: the latest t̂ seen (also for non-finite results).
        n_params: reported N (for compute weights), if any.
        total_tokens: reported D (for compute weights), if any.
        latest_prediction: ``{"rung", "train_fraction", "final_loss", "uncertainty"}`` of the
            latest rung at which the trial was predicted.
        sweep_values: η, B, λ, τ, TPP, N and schedule (``hpo.rules.sweep_values``), from the
            latest result and the config: what tells the kind of sweep.
        redone: the training fraction the trial trained twice because it was resumed from an
            earlier point than it had reached (a trainable that does not checkpoint restarts
            from 0 after a PAUSE); counted in the sweep's compute.
    """

    trial_id: str
    order: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    controls: Optional[Controls] = None
    history: list[list[float]] = field(default_factory=list)
    status: str = "pending"
    stopped_at: Optional[float] = None
    would_stop_at: Optional[float] = None
    diverged_at: Optional[float] = None
    final_metric: Optional[float] = None
    last_train_fraction: float = 0.0
    n_params: Optional[float] = None
    total_tokens: Optional[float] = None
    latest_prediction: Optional[dict[str, Any]] = None
    sweep_values: dict[str, Any] = field(default_factory=dict)
    redone: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.controls, Mapping):  # as written in the state file
            try:
                self.controls = Controls.from_mapping(self.controls)
            except (KeyError, ValueError, TypeError):
                # e.g. τ = ∞ (no weight decay), which strict JSON writes as null: the scheduler
                # reads the controls again from the trial's next result.
                self.controls = None

    def add_point(self, t: float, value: float, eps: float = 1e-9) -> bool:
        """Append (t̂, loss) to the history; a repeated t̂ replaces the last point, an earlier one
        (a restore from an earlier checkpoint) first drops the superseded points. Returns True
        when points were dropped."""
        rewound = bool(self.history) and t < self.history[-1][0] - eps
        if rewound:
            self.redone += self.history[-1][0] - t
            self.history = [p for p in self.history if p[0] < t - eps]
        if self.history and abs(t - self.history[-1][0]) <= eps:
            self.history[-1] = [t, value]
        else:
            self.history.append([t, value])
        self.last_train_fraction = self.history[-1][0]
        return rewound

    def to_dict(self, with_history: bool = True, safe: bool = True) -> dict[str, Any]:
        # Field by field (not dataclasses.asdict, which deep-copies the whole curve even when
        # the snapshot leaves it out).
        names = _field_names(type(self))
        out = _safe_fields(self, names if with_history else tuple(n for n in names if n != "history"), safe)
        if self.controls is not None:
            out["controls"] = _fast_safe(self.controls.to_dict()) if safe else self.controls.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialRecord":
        rec = cls(**_known(cls, data))
        if rec.status not in TRIAL_STATUSES:
            raise ValueError(f"trial {rec.trial_id}: unknown status {rec.status!r}")
        rec.history = [[float(t), float(v)] for t, v in rec.history or []]
        rec.config = dict(rec.config or {})
        rec.last_train_fraction = float(rec.last_train_fraction or 0.0)
        return rec


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
        # 10,000): the same text whenever that walk would have changed nothing.
        if indent is None and all(_str_keys(rec.config) for rec in self.trials.values()):
            text = _plain_json(self.to_dict(with_history, safe=False))
            if text is not None:
                return text
        return json.dumps(self.to_dict(with_history), indent=indent, allow_nan=False, ensure_ascii=False,
                          separators=(",", ":") if indent is None else None)

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
        if len(self.rungs) != len(rungs) or any(r.index != i for i, r in enumerate(self.rungs)):
            raise ValueError(f"{source}: state has {len(self.rungs)} rung records for {len(rungs)} rungs")

    def eliminated(self, rec: TrialRecord) -> bool:
        """Out of the rung competition: stopped, diverged, errored or (audit) would have been stopped."""
        return rec.status in HALTED_STATUSES or (
            self.settings.get("decision_mode") == "audit" and rec.would_stop_at is not None)

    def verdict(self, trial_id: str) -> str:
        """``completed``, ``stopped_at_<fraction>``, ``diverged``, ``error``, ``stopped``,
        ``running``, ``paused``, ``pending`` or ``unknown``."""
        rec = self.trials.get(trial_id)
        if rec is None:
            return "unknown"
        return f"stopped_at_{rec.stopped_at:g}" if rec.status == "stopped" and rec.stopped_at is not None else rec.status

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
            "status": rec.status, "verdict": self.verdict(rec.trial_id),
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
        alive = [rec for rec in recs if rec.history and rec.status not in HALTED_STATUSES]
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
        count = {s: sum(r.status == s for r in recs) for s in ("stopped", "diverged", "completed", "error")}
        margin = st.get("margin")
        margin_words = margin if margin != "calibrated" else f"calibrated, z={st.get('margin_z', 1.0):g}"
        lines = [f"Using CollapseScheduler ({st.get('decision_mode')}; {st.get('metric')} {st.get('mode')}; "
                 f"rf={st.get('reduction_factor', 0):g}; margin={margin_words}): "
                 f"{len(recs)} trials, {count['stopped']} stopped, {count['diverged']} diverged, "
                 f"{count['completed']} completed, {count['error']} errored"]
        live = sum(1 for r in recs if r.status in ("pending", "running", "paused") and not self.eliminated(r))
        for rung in self.rungs:
            if rung.decided:
                state = (f"decided, kept {len(rung.survivors)}/{rung.n_participants} "
                         f"[{', '.join(rung.survivors)}], predicted best {rung.predicted_best}")
            elif st.get("decision_mode") == "async":
                kept = sum(e.decision in ("continue", "keep") for e in rung.entries.values())
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
        with open(self.path, "w" if start else "a", encoding="utf-8") as handle:
            handle.write("".join(self._buffer))
        self._buffer.clear()

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
            if rec.status == "diverged" and rec.diverged_at is not None:
                rec.last_train_fraction = max(rec.last_train_fraction, rec.diverged_at)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_PLAIN = (str, int, bool, type(None))


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _safe_fields(obj: Any, names: tuple[str, ...], safe: bool = True) -> dict[str, Any]:
    """``json_safe`` of the named fields (``safe``), with a fast path for the plain values most
    fields hold (a 10,000-trial snapshot is ~1e6 of them); else the fields as they are."""
    if not safe:
        return {name: getattr(obj, name) for name in names}
    return {name: _fast_safe(getattr(obj, name)) for name in names}


def _as_is(value: Any) -> Any:
    return value


class _NotPlain(TypeError):
    """A value the JSON encoder would need ``json_safe`` for."""


def _refuse(value: Any) -> Any:
    raise _NotPlain(type(value).__name__)


def _str_keys(value: Any) -> bool:
    """Every dict key in ``value`` (dicts and lists, walked) is a string: json would write a
    key ``True`` or ``None`` as ``true``/``null``, ``json_safe`` as ``"True"``/``"None"``."""
    if type(value) is dict:
        return all(type(k) is str and _str_keys(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_str_keys(v) for v in value)
    return True


def _plain_json(data: Any) -> Optional[str]:
    """Compact JSON of ``data`` by json's C encoder alone, or None when ``json_safe`` could
    have made a difference: a value JSON has no type for (a numpy integer or array, a set, a
    path: ``_refuse``) or a non-finite float (written ``NaN``/``Infinity``; a string holding
    those words also declines, harmlessly). The keys of a trial's config are checked by the
    caller (``_str_keys``); every other dict in the state is the scheduler's, keyed by
    strings."""
    try:
        text = json.dumps(data, allow_nan=True, ensure_ascii=False, separators=(",", ":"), default=_refuse)
    except (TypeError, ValueError):
        return None
    if "NaN" in text or "Infinity" in text:
        return None
    return text


def _fast_safe(value: Any) -> Any:
    """``json_safe(value)``, walking plain dicts and lists itself (a trial's config, its sweep
    values and latest prediction are such); anything else goes to ``json_safe``."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                return json_safe(value)
            out[key] = _fast_safe(item)
        return out
    if kind is list:
        return [_fast_safe(item) for item in value]
    return json_safe(value)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of the dataclass ``cls`` (forward compatibility)."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}
