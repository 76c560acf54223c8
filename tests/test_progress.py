"""Live progress (hpo/reporting/progress.py): rung decisions announced as made, readable at 80 columns."""

from __future__ import annotations

import io

from rich.console import Console

from hpo.reporting.progress import RungAnnouncer, rung_line


def test_rung_line_fits_80_columns_and_names_both_bests():
    line = rung_line(0.3, ["f550f_00001", "f550f_00002"], 6, "f550f_00001", "f550f_00002")
    assert all(len(part) <= 80 for part in line.splitlines())
    assert "kept 2 of 6\n  predicted best f550f_00001, current best f550f_00002" in line
    many = rung_line(0.1, [f"f550f_{i:05d}" for i in range(40)], 80, "f550f_00001", "f550f_00001")
    assert all(len(part) <= 80 for part in many.splitlines()) and many.count("f550f_") == 41
    same = rung_line(0.3, ["a"], 2, "a", "a")
    assert "predicted best a (also the current best)" in same


def test_announcer_prints_the_decision_when_called(capsys):
    # CollapseScheduler calls it at the decision, before the early answer is emitted, so the
    # rung line precedes the answer that depends on it; it remembers what it printed so the
    # progress callback does not print the rung again.
    announcer = RungAnnouncer()
    announcer({"fraction": 0.2, "kept": ["a", "b"], "stopped": ["c", "d"], "predicted_best": "a",
               "current_best": "b"})
    printed = capsys.readouterr().out
    assert "rung t̂=0.2 decided: kept 2 of 4\n  predicted best a, current best b" in printed
    assert announcer.announced == {0.2}


def test_progress_line_shows_the_slots_busy(capsys):
    # A trial the scheduler stops frees its slot: the line counts RUNNING trials, not the one
    # Ray is completing (it is still RUNNING when the callback runs).
    from types import SimpleNamespace

    from hpo.reporting.progress import SweepProgress

    summary = {"trials": {"a": {"status": "running"}, "b": {"status": "stopped"}, "c": {"status": "running"}},
               "compute_fraction": 0.25, "rung_status": []}
    progress = SweepProgress(SimpleNamespace(summary=lambda: summary), slots=2)
    a, b, c = (SimpleNamespace(status="RUNNING") for _ in range(3))
    progress.on_trial_complete(0, [a, b, c], b)
    assert "[progress] 3 trials, 2 in the race, 2/2 slots busy, compute 25%" in capsys.readouterr().out
    c.status = "PENDING"
    progress.on_trial_complete(0, [a, b, c], b)
    assert "1/2 slots busy" in capsys.readouterr().out


def test_a_progress_line_is_one_line_at_80_columns(capsys, monkeypatch):
    # In a log (no terminal, 80 columns) a long progress line stays one line: wrapped, its trial
    # id would stand alone on the next line and read as output of its own.
    from types import SimpleNamespace

    from hpo.reporting.progress import SweepProgress

    monkeypatch.setenv("COLUMNS", "80")
    summary = {"trials": {f"t{i}": {"status": "running"} for i in range(6)}, "compute_fraction": 0.1,
               "rung_status": [], "predicted_best": {"trial_id": "b1808_00002"}}
    progress = SweepProgress(SimpleNamespace(summary=lambda: summary), slots=2)
    progress.on_trial_complete(0, [SimpleNamespace(status="RUNNING")], None)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) > 80 and lines[0].endswith("predicted best b1808_00002")
