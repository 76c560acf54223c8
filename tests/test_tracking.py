"""MLflow records of a sweep on a real SQLite store: no duplicate runs across driver runs, the
parent FAILED on any exception, runs left RUNNING closed, and a copied store re-pointed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpo.service.sweep import verdict_from_state
from hpo.tracking.runs import SweepTracker, relocate_sqlite_store


def _tracker(output: Path) -> SweepTracker:
    output.mkdir(parents=True, exist_ok=True)
    return SweepTracker(f"sqlite:///{output / 'mlflow.db'}", "t", output, "sweep",
                        artifact_location=(output / "mlartifacts").as_uri())


def _runs(tracker: SweepTracker) -> list:
    return tracker.client.search_runs([tracker.experiment_id()])


def test_an_exception_marks_the_parent_and_open_children_failed(tmp_path: Path) -> None:
    tracker = _tracker(tmp_path / "out")
    with pytest.raises(RuntimeError, match="boom"):
        with tracker.running({"sweep": "sweep"}):
            tracker.child_run_id("t1", "trial 1")
            raise RuntimeError("boom")
    assert sorted(r.info.status for r in _runs(tracker)) == ["FAILED", "FAILED"]


def test_a_new_driver_reuses_runs_even_when_the_id_file_missed_one(tmp_path: Path) -> None:
    # A driver killed between creating a child run and saving its id: the next driver finds
    # the run by its trial_id tag instead of creating a second one; the parent is RUNNING again.
    output = tmp_path / "out"
    first = _tracker(output)
    parent = first.start({"sweep": "sweep"})
    child = first.child_run_id("t1", "trial 1")
    first.finish_parent("FAILED")
    ids = json.loads((output / "mlflow_runs.json").read_text())
    ids["trials"] = {}
    (output / "mlflow_runs.json").write_text(json.dumps(ids))

    second = _tracker(output)
    assert second.start() == parent
    assert second.child_run_id("t1", "trial 1") == child
    assert len(_runs(second)) == 2
    assert second.client.get_run(parent).info.status == "RUNNING"


def test_resume_closes_runs_of_finished_trials_left_running(tmp_path: Path) -> None:
    tracker = _tracker(tmp_path / "out")
    tracker.start()
    done, live = tracker.child_run_id("done", "done"), tracker.child_run_id("live", "live")
    trials = {"done": {"status": "stopped", "stopped_at": 0.2}, "live": {"status": "paused"}}
    assert tracker.close_finished(trials, verdict_from_state) == 1
    assert tracker.client.get_run(done).info.status == "FINISHED"
    assert tracker.client.get_run(done).data.tags["status"] == "stopped_at_0.2"
    assert tracker.client.get_run(live).info.status == "RUNNING"


def test_a_copied_store_logs_artifacts_into_the_copy(tmp_path: Path) -> None:
    # MLflow keeps absolute artifact URIs; after relocation the copy's runs log into the copy.
    original = tmp_path / "a"
    tracker = _tracker(original)
    parent = tracker.start()
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    assert relocate_sqlite_store(f"sqlite:///{copy / 'mlflow.db'}", original, copy) == 2
    moved = _tracker(copy)
    assert moved.client.get_run(parent).info.artifact_uri.startswith(copy.as_uri() + "/")
    note = tmp_path / "note.txt"
    note.write_text("x")
    moved.log_parent_artifacts([note])
    assert list(copy.glob("mlartifacts/*/artifacts/note.txt"))
    assert not list(original.glob("mlartifacts/**/note.txt"))


def test_published_decisions_and_early_answer_read_back_from_the_store_alone(tmp_path: Path) -> None:
    # What `hpo status` / `hpo answer` read: found by the job-id tag, progress and the answer
    # back from tags and artifacts; the answer is there only once its tag is set.
    from hpo.tracking.runs import JOB_TAG, find_job_run, read_published

    tracker = _tracker(tmp_path / "out")
    tracker.start({"sweep": "sweep"})
    tracker.tag_parent({JOB_TAG: "job-1"})
    progress = [{"fraction": 0.1, "decided": True, "reached": 4, "alive": 2, "stopped": 2, "finished": 0}]
    tracker.publish_decision({"rung": 0, "fraction": 0.1, "progress": progress, "compute_fraction": 0.1})
    run = find_job_run(tracker.client, "t", "job-1")
    published = read_published(tracker.client, run)
    assert published["rungs_decided"] == 1 and published["early_answer"] is None
    assert published["progress"]["progress"] == progress and published["progress"]["compute_fraction"] == 0.1
    answer = {"trial_id": "a_00001", "config": {"lr": 0.01}, "predicted_final_loss": 1.7, "uncertainty": 0.04,
              "kept": [f"a_{i:05d}" for i in range(1000)]}  # a 1,000-trial keep list: the tag is cut, not lost
    tracker.publish_early_answer(answer)
    published = read_published(tracker.client, tracker.client.get_run(run.info.run_id))
    assert published["early_answer"] == answer
    assert find_job_run(tracker.client, "t", "job-2") is None


def test_ids_in_mlflow_filters_are_checked_never_spliced() -> None:
    # A quote in a Ray job id used to be spliced into the filter string: `hpo status` crashed,
    # and a crafted id could select another job's runs. A plain id is quoted; anything else is
    # refused as input, naming the field.
    from hpo.common.errors import InputError
    from hpo.tracking.runs import find_job_run, record_stop

    class Client:
        def __init__(self) -> None:
            self.filters: list[str] = []

        def get_experiment_by_name(self, name):
            return type("E", (), {"experiment_id": "1"})()

        def get_run(self, run_id):
            return type("R", (), {"info": type("I", (), {"experiment_id": "1"})()})()

        def search_runs(self, ids, filter_string, **kwargs):
            self.filters.append(filter_string)
            return []

    client = Client()
    assert find_job_run(client, "x", "raysubmit_8Gk2-1") is None
    assert client.filters == ["tags.`collapse_hpo.job_id` = 'raysubmit_8Gk2-1'"]
    for bad in ("a' or tags.x = 'b", "x'", "", "a b", "'"):
        with pytest.raises(InputError, match="JOB: .* is not a valid id"):
            find_job_run(client, "x", bad)
    with pytest.raises(InputError, match="run id"):
        record_stop(client, "abc' or '1'='1", {})
    assert len(client.filters) == 1  # nothing reached the store


def test_results_reach_the_metric_history_when_reported_and_exactly_once_across_a_resume(tmp_path: Path) -> None:
    # The result log runs where Ray calls stoppers: before the scheduler persists a decision built
    # on the result. A driver killed after it is resumed by a new driver whose trials report
    # again from their checkpoint: steps already in the history are skipped, new ones logged.
    from hpo.tracking.runs import MlflowResultLog

    output = tmp_path / "out"
    first = _tracker(output)
    first.start()
    log = MlflowResultLog(first)
    for step in (10, 20, 30):
        assert log("t1", {"step": step, "loss": 3.0 - step / 100, "train_fraction": step / 100}) is False
    run = first.child_run_id("t1", "t1")
    assert [m.step for m in first.client.get_metric_history(run, "loss")] == [10, 20, 30]  # at once, no callback

    second = _tracker(output)  # `hpo resume`: a new driver, the same store
    second.start()
    again = MlflowResultLog(second)
    for step in (20, 30, 40):  # retrained from the checkpoint at step 10
        again("t1", {"step": step, "loss": 3.0 - step / 100, "train_fraction": step / 100})
    again("t1", {"step": 40, "loss": 2.6, "replayed": True})
    history = second.client.get_metric_history(run, "loss")
    assert sorted(m.step for m in history) == [10, 20, 30, 40]
    assert sorted(m.step for m in second.client.get_metric_history(run, "train_fraction")) == [10, 20, 30, 40]
    assert len(_runs(second)) == 2  # parent + the one trial run


def test_resume_rebuilds_the_early_answer_file_and_tags_from_the_state(tmp_path: Path) -> None:
    # Killed after the scheduler persisted its early answer, before predicted_best.json and the
    # parent's tags were written: `hpo resume` writes both again from the state.
    from hpo.decisions.early_answer import EarlyAnswer
    from hpo.service.sweep import restore_early_answer
    from hpo.tracking.runs import EARLY_ANSWER_TAG

    output = tmp_path / "out"
    tracker = _tracker(output)
    parent = tracker.start()
    answer = {"trial_id": "t2", "config": {"lr": 0.01}, "predicted_final_loss": 3.1, "uncertainty": 0.02,
              "rung": 0.4, "kept": ["t2"], "margin": 0.0, "compute_fraction": 0.45}
    (output / "scheduler_state.json").write_text(json.dumps({"early_answer": answer}))
    early = EarlyAnswer(output, tracker)
    assert restore_early_answer(output, early, tracker) is True
    assert json.loads((output / "predicted_best.json").read_text()) == answer
    tags = tracker.client.get_run(parent).data.tags
    assert tags[EARLY_ANSWER_TAG] == "1" and tags["predicted_best.trial_id"] == "t2"
    assert restore_early_answer(output, early, tracker) is False  # both present: nothing rewritten
    (output / "predicted_best.json").unlink()
    assert restore_early_answer(output, early, tracker) is True
    assert (output / "predicted_best.json").exists()
    (output / "scheduler_state.json").write_text(json.dumps({"early_answer": None}))
    (output / "predicted_best.json").unlink()
    assert restore_early_answer(output, early, tracker) is False  # no answer yet: none invented
    assert not (output / "predicted_best.json").exists()


# Asserts: the sweep's stopper, pickled into Ray's experiment state, comes back on resume as the
# resuming driver's live stopper, never the old driver's (whose result log holds the old
# folder's MLflow store: a resumed copy of a sweep logged into the original).
def test_live_stopper_unpickles_as_the_live_one() -> None:
    import pickle

    from ray.tune.stopper import NoopStopper

    from hpo.tracking.runs import LiveStopper

    old = LiveStopper(NoopStopper())
    saved = pickle.dumps(old)
    new = LiveStopper(NoopStopper())  # the resuming driver builds its own
    assert pickle.loads(saved) is new
    LiveStopper.live = None
    assert isinstance(pickle.loads(saved), NoopStopper)
