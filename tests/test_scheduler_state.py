"""Tests of the persisted scheduler state (``hpo/decisions/scheduler_state.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hpo.decisions.scheduler_state import (
    SCHEMA_VERSION,
    RungEntry,
    RungRecord,
    SchedulerState,
    StateFileError,
    TrialRecord,
    json_safe,
)


def _state() -> SchedulerState:
    rung = RungRecord(index=0, fraction=0.1, decided=True, n_participants=2, n_keep=1,
                      survivors=["a"], predicted_best="a", current_best="b", compute_fraction=0.1)
    rung.entries["a"] = RungEntry("a", 0.1, 3.2, 2, 2.5, 0.01, "continue", "best")
    rung.entries["b"] = RungEntry("b", 0.1, 3.1, 2, float("nan"), None, "stop", "worse")
    return SchedulerState(
        settings={"rungs": [0.1], "decision_mode": "sync"},
        trials={
            "a": TrialRecord("a", 0, {"lr": np.float64(1e-3), "nested": {"k": (1, 2)}},
                             history=[[0.05, 3.5], [0.1, 3.2]], status="paused"),
            "b": TrialRecord("b", 1, {"lr": 1e-2}, history=[[0.1, 3.1]], status="stopped", stopped_at=0.1),
        },
        rungs=[rung],
        early_answer={"trial_id": "a", "uncertainty": float("inf")},
    )


# Asserts: to_json → from_json keeps every field (NaN/inf written as null, numpy/tuple made plain).
def test_round_trip_preserves_records():
    state = _state()
    back = SchedulerState.from_json(state.to_json())
    assert back.version == SCHEMA_VERSION
    assert back.trials["a"].history == [[0.05, 3.5], [0.1, 3.2]]
    assert back.trials["a"].config == {"lr": 1e-3, "nested": {"k": [1, 2]}}
    assert back.trials["b"].stopped_at == 0.1 and back.trials["b"].status == "stopped"
    assert back.rungs[0].entries["a"].decision == "continue"
    assert back.rungs[0].entries["b"].predicted_final_loss is None
    assert back.early_answer == {"trial_id": "a", "uncertainty": None}
    json.loads(state.to_json())  # strict JSON: no NaN tokens


# Asserts: save() writes atomically (no temp file left behind) and load() reads it back.
def test_save_is_atomic_and_loadable(tmp_path):
    path = tmp_path / "out" / "scheduler_state.json"
    _state().save(path)
    _state().save(path)
    assert [p.name for p in path.parent.iterdir()] == ["scheduler_state.json"]
    assert SchedulerState.load(path).trials["a"].status == "paused"
    assert SchedulerState.load(path).updated_at is not None


# Asserts: malformed files raise StateFileError whose message names the file.
@pytest.mark.parametrize("text", [
    "{not json",
    "[]",
    json.dumps({"version": 99, "trials": {}, "rungs": []}),
    json.dumps({"version": SCHEMA_VERSION, "trials": {"a": {"trial_id": "a", "status": "weird"}}, "rungs": []}),
    json.dumps({"version": SCHEMA_VERSION, "trials": {"a": {"trial_id": "b"}}, "rungs": []}),
    json.dumps({"version": SCHEMA_VERSION, "trials": {}, "rungs": [{"fraction": 0.1}]}),
])
def test_malformed_file_names_the_file(tmp_path, text):
    path = tmp_path / "scheduler_state.json"
    path.write_text(text)
    with pytest.raises(StateFileError, match="scheduler_state.json"):
        SchedulerState.load(path)


# Asserts: a missing file is a StateFileError naming the file too.
def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(StateFileError, match="nope.json"):
        SchedulerState.load(tmp_path / "nope.json")


# Asserts: json_safe maps non-finite floats to None and unknown objects to their repr.
def test_json_safe():
    out = json_safe({"a": math.inf, 1: np.int64(3), "b": np.array([1.0, np.nan]), "c": object})
    assert out["a"] is None and out["1"] == 3 and out["b"] == [1.0, None]
    assert isinstance(out["c"], str)


def test_history_log_replays_curves_rewinds_and_a_torn_line(tmp_path):
    # The snapshot holds no curves; load() rebuilds them from the append-only log, applying a
    # restore's rewind (t̂ going back drops the later points) and ignoring a line cut by a kill.
    from hpo.decisions.scheduler_state import HistoryLog, SchedulerState, TrialRecord, history_path

    path = tmp_path / "scheduler_state.json"
    state = SchedulerState(trials={"a": TrialRecord(trial_id="a")}, experiment_id="x")
    log = HistoryLog(history_path(path))
    for t, v in ((0.1, 3.0), (0.2, 2.5), (0.3, 2.2), (0.2, 2.4), (0.25, 2.3)):
        log.append("a", t, v)
    log.append("b", 0.1, 2.9)  # a trial added after the last snapshot
    log.flush(start=True)
    with open(history_path(path), "a") as handle:
        handle.write('["a", 0.3')  # torn
    state.save(path, with_history=False)
    back = SchedulerState.load(path)
    assert back.trials["a"].history == [[0.1, 3.0], [0.2, 2.4], [0.25, 2.3]]
    assert back.trials["b"].history == [[0.1, 2.9]] and back.experiment_id == "x"


def test_controls_stay_typed_in_memory_and_round_trip_through_the_state_file(tmp_path):
    # A record holds predictors.Controls (not a dict re-parsed at every rung); the state file
    # holds Controls.to_dict() and load() gives the same Controls back. A τ = ∞ trial (no weight
    # decay), which strict JSON writes as null, loads without controls: the scheduler re-reads
    # them from the trial's next result rather than failing the restore.
    import math

    from hpo.decisions.scheduler_state import SchedulerState, TrialRecord
    from predictors import Controls
    from predictors.schedules import Schedule

    ctrl = Controls(0.4, 20.0, Schedule("cosine", 0.05, 0.2), n_params=1.5e5)
    path = tmp_path / "scheduler_state.json"
    SchedulerState(trials={"a": TrialRecord("a", controls=ctrl),
                           "b": TrialRecord("b", controls=Controls(math.inf, 20.0))}).save(path)
    written = json.loads(path.read_text())["trials"]
    assert written["a"]["controls"] == ctrl.to_dict() and written["b"]["controls"]["tau"] is None
    back = SchedulerState.load(path)
    assert isinstance(back.trials["a"].controls, Controls) and back.trials["a"].controls == ctrl
    assert back.trials["b"].controls is None


def test_snapshot_fast_path_writes_what_json_safe_writes() -> None:
    # The snapshot of 10,000 trials is written at every rung decision: its fields take a fast
    # path for plain values; the result must be json_safe's, value for value.
    from dataclasses import fields as dc_fields

    import numpy as np

    from hpo.decisions.scheduler_state import RungEntry, TrialRecord
    from predictors.controls import Controls
    from predictors.io import json_safe

    entry = RungEntry(trial_id="t1", train_fraction=0.2, smoothed_loss=float("nan"), n_points=3,
                      predicted_final_loss=np.float32(2.5), uncertainty=float("inf"), late=True)
    assert entry.to_dict() == json_safe({f.name: getattr(entry, f.name) for f in dc_fields(entry)})
    rec = TrialRecord(trial_id="t1", order=0, config={"lr": np.float64(0.01), "nested": {"x": float("nan"), 1: 2},
                                                      "grid": [1.0, float("inf"), (1, 2), {"y": np.int64(3)}]},
                      status="running", history=[[0.1, 3.0]], latest_prediction={"final_loss": np.float32(2.0)})
    rec.controls = Controls(0.3, 20.0)
    for with_history in (True, False):
        expected = {f.name: getattr(rec, f.name) for f in dc_fields(rec) if with_history or f.name != "history"}
        expected["controls"] = rec.controls.to_dict()
        assert rec.to_dict(with_history) == json_safe(expected)


# Asserts: the snapshot's text is the strict JSON of json_safe(to_dict()) byte for byte, whether
# json's encoder writes it alone (plain values) or the safe walk must (NaN, numpy ints, a key
# that json would write differently).
@pytest.mark.parametrize("odd", [None, "nan", "numpy_int", "bool_key", "set"])
def test_snapshot_text_is_the_strict_json_of_the_safe_dict(odd) -> None:
    from predictors.io import loads_strict

    state = _state()
    state.early_answer = {"trial_id": "a", "uncertainty": 0.5}
    state.rungs[0].entries["b"].predicted_final_loss = 2.6
    for rec in state.trials.values():
        rec.config = {"lr": 1e-3, "nested": {"k": [1, 2]}, "name": "plain"}
    rec = state.trials["a"]
    if odd == "nan":
        rec.final_metric = float("nan")
    elif odd == "numpy_int":
        rec.n_params = np.int64(7)
    elif odd == "bool_key":
        rec.config = {True: 1, "x": [{None: 2}]}
    elif odd == "set":
        rec.config = {"grid": {1, 2}}
    for with_history in (True, False):
        expected = json.dumps(state.to_dict(with_history), allow_nan=False, ensure_ascii=False,
                              separators=(",", ":"))
        assert state.to_json(with_history=with_history) == expected
    text = state.to_json()
    loads_strict(text)  # strict JSON: no NaN/Infinity
    if odd == "bool_key":
        assert '"True":1' in text


# Asserts: a history line is what json.dumps([trial_id, t, loss]) writes, and replays.
def test_history_lines_are_json_lists(tmp_path):
    from hpo.decisions.scheduler_state import HistoryLog

    log = HistoryLog(tmp_path / "h.jsonl")
    points = [("t\"1é", 0.1, 2.0), ("b", 1e-20, 1e300), ("b", 0.30000000000000004, 5e-324)]
    for tid, t, v in points:
        log.append(tid, t, v)
    log.flush(start=True)
    lines = (tmp_path / "h.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines == [json.dumps(list(p)) for p in points]


# Asserts: status and decision are enums that are their strings: a state file's words load as
# members, are written back as the same words, and an unknown word names the record.
def test_statuses_and_decisions_are_their_strings(tmp_path):
    from hpo.decisions.scheduler_state import RungDecision, TrialStatus, verdict

    state = _state()
    state.early_answer = None
    path = tmp_path / "scheduler_state.json"
    state.save(path)
    back = SchedulerState.load(path)
    a, b = back.trials["a"], back.trials["b"]
    assert a.status is TrialStatus.PAUSED and a.alive and not a.halted and not a.out
    assert b.status is TrialStatus.STOPPED and b.halted and b.out and not b.alive
    assert back.rungs[0].entries["b"].decision is RungDecision.STOP and back.rungs[0].entries["b"].decision.stopped
    assert back.rungs[0].entries["a"].decision.kept and not back.rungs[0].entries["a"].waiting
    raw = json.loads(path.read_text())
    assert raw["trials"]["b"]["status"] == "stopped" and raw["rungs"][0]["entries"]["a"]["decision"] == "continue"
    assert back.verdict("b") == verdict("stopped", 0.1) == "stopped_at_0.1" and back.verdict("a") == "paused"
    assert type(back.summary(0.0)["trials"]["a"]["status"]) is str
    raw["trials"]["a"]["status"] = "sleeping"
    path.write_text(json.dumps(raw))
    with pytest.raises(StateFileError, match="trial a: unknown status 'sleeping'"):
        SchedulerState.load(path)


# Asserts: a trial waits at the first undecided rung it has an undecided entry at, and nowhere else.
def test_waiting_rung_predicate():
    from hpo.decisions.scheduler_state import RungDecision

    state = _state()
    state.rungs.append(RungRecord(index=1, fraction=0.2))
    state.rungs[1].entries["a"] = RungEntry("a", 0.2, 3.0, 3)
    assert state.rungs[1].entries["a"].decision is RungDecision.PENDING
    assert state.waiting_rung("a") is state.rungs[1] and state.waiting_rung("b") is None
    assert not state.rungs[0].waiting("a") and state.rungs[1].waiting("a")
    assert state.may_run("a", sync=True) is False and state.may_run("a", sync=False) is True
    assert state.may_run("b", sync=False) is False and state.may_run("unknown", sync=True) is True


def test_debug_string_states_the_default_margin_z():
    # Settings that omit margin_z state the default the scheduler uses (it printed 1.0).
    from hpo.decisions.keep.collapse import DEFAULT_MARGIN_Z

    state = _state()
    state.settings = {"rungs": [0.1], "decision_mode": "sync", "margin": "calibrated"}
    assert f"rule collapse (margin_z={DEFAULT_MARGIN_Z:g})" in state.debug_string() and DEFAULT_MARGIN_Z != 1.0


def test_binary_state_file_names_the_file(tmp_path):
    # `hpo resume` on a folder whose state file is binary: one line, not a UnicodeDecodeError.
    path = tmp_path / "scheduler_state.json"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(StateFileError, match="scheduler_state.json: not a scheduler state file .*binary"):
        SchedulerState.load(path)


def test_a_line_appended_after_a_torn_history_line_is_kept(tmp_path):
    # A driver killed mid-write leaves the log's last line without its newline; the resumed
    # driver's first appended point must not be glued to it (and lost with it at the next load).
    from hpo.decisions.scheduler_state import HistoryLog, SchedulerState, TrialRecord, history_path

    path = tmp_path / "scheduler_state.json"
    SchedulerState(trials={"a": TrialRecord(trial_id="a")}, experiment_id="x").save(path, with_history=False)
    history_path(path).write_text('["a", 0.1, 3.0]\n["a", 0.2')  # torn by a kill
    resumed = HistoryLog(history_path(path))
    resumed.append("a", 0.2, 2.5)
    resumed.flush()
    resumed.append("a", 0.3, 2.2)
    resumed.flush()
    assert SchedulerState.load(path).trials["a"].history == [[0.1, 3.0], [0.2, 2.5], [0.3, 2.2]]


def test_sigkill_of_a_state_writer_leaves_the_old_or_the_new_state(tmp_path):
    # A real kill -9, 40 times, of a process writing a 300-trial state and its history in a loop
    # (each round continues the state on disk, as `hpo resume` does): every state on disk parses,
    # is one whole version (never two mixed), never goes back, and has every history point up to
    # it; kills that landed inside a snapshot write are counted (their temporary file), and a
    # resumed store clears those files.
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from reliability_faults import kill_state_writer

    got = kill_state_writer(tmp_path, rounds=40, seed=1)
    assert got["unreadable"] == got["mixed"] == got["went_back"] == got["points_lost"] == 0, got
    assert got["mid_write"] >= 1 and got["versions_written"] >= 5, got  # the kills did land in writes
    assert got["tmp_left_after_resume"] == 0, got
