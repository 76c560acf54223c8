"""The records of :mod:`hpo.decisions.scheduler_state`: a trial, a rung, one trial judged at one rung,
and the two vocabularies they are written in (:class:`TrialStatus`, :class:`RungDecision`).

Both vocabularies are ``StrEnum``: a member *is* its string (``TrialStatus.STOPPED ==
"stopped"``), so ``scheduler_state.json``, MLflow tags and printed verdicts keep their exact
words and state files written before the enums load unchanged. What the scheduler, sweep,
progress display, analysis, plots and tracking ask of a record is a predicate here
(``TrialRecord.alive``, ``RungEntry.waiting``, ``RungRecord.waiting``, ...), not a string
compared in each of them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Mapping, Optional

from hpo.decisions.keep.evidence import Candidate, KeepDecision
from predictors.controls import Controls
from predictors.io import json_safe


class TrialStatus(StrEnum):
    """A trial as the scheduler sees it (Ray's PENDING/RUNNING/PAUSED/TERMINATED/ERROR, with
    TERMINATED told apart: run to the end, stopped by a rung, or diverged)."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    STOPPED = "stopped"
    DIVERGED = "diverged"
    ERROR = "error"

    @property
    def alive(self) -> bool:
        """Running, or waiting to (Ray may still hand it a slot)."""
        return self in _ALIVE

    @property
    def terminal(self) -> bool:
        """Takes no further part in any rung."""
        return not self.alive



_ALIVE = frozenset({TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED})
_HALTED = frozenset({TrialStatus.STOPPED, TrialStatus.DIVERGED, TrialStatus.ERROR})


class RungDecision(StrEnum):
    """A line of a rung's decision log: what happened to one trial at one rung."""

    PENDING = "pending"  #: reached the rung, which is not decided yet
    CONTINUE = "continue"  #: kept at an intermediate rung
    KEEP = "keep"  #: kept at the last rung
    STOP = "stop"  #: stopped
    WOULD_KEEP = "would_keep"  #: audit mode: sync would have kept it
    WOULD_STOP = "would_stop"  #: audit mode: sync would have stopped it
    COMPLETED = "completed"  #: finished before the rung was decided: nothing left to stop
    REMOVED = "removed"  #: left the sweep (error, removal, divergence) before the rung was decided

    @property
    def kept(self) -> bool:
        return self in (RungDecision.CONTINUE, RungDecision.KEEP, RungDecision.WOULD_KEEP)

    @property
    def stopped(self) -> bool:
        """Stopped, or (audit) would have been."""
        return self in (RungDecision.STOP, RungDecision.WOULD_STOP)

    @property
    def ends_here(self) -> bool:
        """The trial goes no further than this rung (pending: not yet)."""
        return self in (RungDecision.PENDING, RungDecision.STOP, RungDecision.WOULD_STOP)

    @staticmethod
    def verdict(keep: bool, *, audit: bool, last: bool, completed: bool) -> "RungDecision":
        """The decision written for a trial the keep rule kept or dropped: in audit mode what
        sync would have done; a dropped trial that had already finished is ``completed``."""
        if audit:
            return RungDecision.WOULD_KEEP if keep else RungDecision.WOULD_STOP
        if keep:
            return RungDecision.KEEP if last else RungDecision.CONTINUE
        return RungDecision.COMPLETED if completed else RungDecision.STOP


def verdict(status: Any, stopped_at: Optional[float]) -> str:
    """A trial's verdict in words (its MLflow ``status`` tag): ``stopped_at_<fraction>`` for a
    trial a rung stopped, else its status."""
    if status == TrialStatus.STOPPED and stopped_at is not None:
        return f"stopped_at_{stopped_at:g}"
    return str(status)


#: Statuses after which a trial takes no further part in any rung.
TERMINAL_STATUSES = frozenset(s for s in TrialStatus if s.terminal)

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
        decision: a :class:`RungDecision`.
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
    decision: RungDecision = RungDecision.PENDING
    reason: str = ""
    late: bool = False
    decided_at: Optional[str] = None
    compute_fraction: Optional[float] = None
    residual: Optional[float] = None  # the alignment's RMS relative residual (the fit to the shape)

    def to_dict(self, safe: bool = True) -> dict[str, Any]:
        return _safe_fields(self, _field_names(type(self)), safe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RungEntry":
        entry = cls(**_known(cls, data))
        entry.train_fraction = float(entry.train_fraction)
        entry.smoothed_loss = _opt_float(entry.smoothed_loss)
        entry.predicted_final_loss = _opt_float(entry.predicted_final_loss)
        entry.uncertainty = _opt_float(entry.uncertainty)
        entry.residual = _opt_float(entry.residual)
        return entry

    def __post_init__(self) -> None:
        self.decision = _member(RungDecision, self.decision, f"rung entry {self.trial_id}: unknown decision")

    @property
    def waiting(self) -> bool:
        """Reached the rung and not yet judged there."""
        return self.decision == RungDecision.PENDING

    def candidate(self) -> Candidate:
        """This trial as the keep rule sees it (``hpo.decisions.keep.Candidate``)."""
        return Candidate(self.trial_id, self.predicted_final_loss, self.smoothed_loss, self.uncertainty)


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
            predicted best; ``hpo.decisions.keep``).
        margin_source: where the margin came from, in words (the ranking error of which kind
            of sweep, or a fixed margin).
        kind: the kind of sweep the participants formed (``predictors.kinds.sweep_kind``).
        order_weight: the order the rule ranked by (``hpo.decisions.keep.evidence.score``: 1 = the
            predicted finals, 0 = the losses at the rung, between: their blend).
        sigma: the σ of that order the rule used (its margin is z·σ; P(best) reads it); None:
            unknown (a rule that ranks by an order whose error was not measured).
        kept_all: True when the spread of all predicted finals was within the margin and
            everyone was kept.
        survivors: ids of the trials kept at the decision (late arrivals append).
        predicted_best: id of the trial the rule ranked best at the rung (the rung's pick).
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
    sigma: Optional[float] = None
    survivors: list[str] = field(default_factory=list)
    predicted_best: Optional[str] = None
    current_best: Optional[str] = None
    compute_fraction: Optional[float] = None
    entries: dict[str, RungEntry] = field(default_factory=dict)

    def waiting(self, trial_id: str) -> bool:
        """The trial reached this rung, which is not decided yet: it waits here (sync mode
        pauses it)."""
        entry = self.entries.get(trial_id)
        return entry is not None and entry.waiting and not self.decided

    def record(self, decision: KeepDecision, kind: str, trials: Mapping[str, "TrialRecord"], *,
               participants: Optional[int] = None, now: Optional[str] = None, compute: Optional[float] = None,
               arrival: Optional[str] = None) -> None:
        """Write down what the rule decided and used, the one path for every decision: a whole
        rung (sync/audit: ``participants`` judged at ``now``), or one ``arrival`` judged against
        the trials recorded here (async, or late), which leaves the rung's margin as it was
        when no decision over the rung was made (the first prediction, or none)."""
        if arrival is not None:
            if arrival in decision.kept and arrival not in self.survivors:
                self.survivors.append(arrival)
            if not decision.n_keep:
                return
        else:
            self.decided, self.decided_at, self.compute_fraction = True, now, compute
            self.n_participants = int(participants or 0)
            self.survivors = sorted(decision.kept, key=lambda tid: trials[tid].order)
            self.n_keep = len(self.survivors)
        self.kept_all = decision.kept_all
        self.predicted_best, self.current_best = decision.predicted_best, decision.current_best
        self.margin, self.margin_source, self.kind = decision.margin, decision.words, kind
        self.order_weight, self.sigma = decision.weight, decision.sigma

    def announcement(self, decision_mode: str, participants: list["RungEntry"], margin_text: str,
                     progress: list[dict[str, Any]]) -> dict[str, Any]:
        """The decision as ``CollapseScheduler(on_decision=...)`` hands it on (printed and
        published on MLflow)."""
        return {"rung": self.index, "fraction": self.fraction, "decision_mode": decision_mode,
                "kept": list(self.survivors), "stopped": [e.trial_id for e in participants if e.decision.stopped],
                "predicted_best": self.predicted_best, "current_best": self.current_best, "margin": self.margin,
                "margin_text": margin_text, "kind": self.kind, "kept_all": self.kept_all,
                "compute_fraction": self.compute_fraction, "decided_at": self.decided_at, "progress": progress}

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
        rung.compute_fraction, rung.sigma = _opt_float(rung.compute_fraction), _opt_float(rung.sigma)
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
        status: a :class:`TrialStatus`.
        stopped_at: the rung fraction at which the scheduler stopped the trial.
        would_stop_at: audit mode: the rung fraction at which sync mode would have stopped it.
        diverged_at: t̂ of the non-finite (or ``diverged=True``) result.
        final_metric: the last finite metric of a completed trial.
        last_train_fraction: the latest t̂ seen (also for non-finite results).
        n_params: reported N (for compute weights), if any.
        total_tokens: reported D (for compute weights), if any.
        latest_prediction: ``{"rung", "train_fraction", "final_loss", "uncertainty"}`` of the
            latest rung at which the trial was predicted.
        sweep_values: η, B, λ, τ, TPP, N and schedule (``predictors.kinds.sweep_values``), from the
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
    status: TrialStatus = TrialStatus.PENDING
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
        self.status = _member(TrialStatus, self.status, f"trial {self.trial_id}: unknown status")
        if isinstance(self.controls, Mapping):  # as written in the state file
            try:
                self.controls = Controls.from_mapping(self.controls)
            except (KeyError, ValueError, TypeError):
                # e.g. τ = ∞ (no weight decay), which strict JSON writes as null: the scheduler
                # reads the controls again from the trial's next result.
                self.controls = None

    @property
    def alive(self) -> bool:
        """Running, or waiting to (:attr:`TrialStatus.alive`)."""
        return self.status in _ALIVE

    @property
    def out(self) -> bool:
        """Stopped by a rung or diverged: ended by the scheduler whenever Ray would run it."""
        return self.status in (TrialStatus.STOPPED, TrialStatus.DIVERGED)

    @property
    def halted(self) -> bool:
        """Stopped, diverged or errored."""
        return self.status in _HALTED

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
        rec.history = [[float(t), float(v)] for t, v in rec.history or []]
        rec.config = dict(rec.config or {})
        rec.last_train_fraction = float(rec.last_train_fraction or 0.0)
        return rec



def _member(enum: Any, value: Any, words: str) -> Any:
    """``value`` (a string read from a state file) as a member of ``enum``; ValueError saying
    ``words`` and the value otherwise."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{words} {value!r}") from None


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_PLAIN = (str, int, bool, type(None), TrialStatus, RungDecision)


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
