"""End to end: a tiny sweep through Ray Tune on CPU, its MLflow records, early answer and report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hpo.service.sweep import run_sweep
from hpo.trials.sweep_config import load_sweep_config
from sweep_fixtures import tiny_sweep


OUTCOME: dict = {}  # the finished sweep's outcome (run_sweep's return value)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import ray

    output = tmp_path_factory.mktemp("sweep") / "out"
    config = load_sweep_config(data=tiny_sweep(output))
    try:
        outcome = run_sweep(config)
    finally:
        ray.shutdown()
    assert outcome["errors"] == []
    OUTCOME.update(outcome)
    return output


def test_outcome_says_where_the_mlflow_records_are(finished_sweep: Path) -> None:
    # The tracking URI and experiment id a user needs for `mlflow ui` and `--from-mlflow`.
    where = OUTCOME["mlflow"]
    assert where["tracking_uri"] == f"sqlite:///{finished_sweep / 'mlflow.db'}"
    assert where["experiment"] == "tiny-test" and where["experiment_id"]
    assert f"--from-mlflow {where['experiment_id']}" in where["text"] and "mlflow ui" in where["text"]


def test_outcome_states_how_busy_the_trial_slots_were(finished_sweep: Path) -> None:
    # The terminal summary reports measured slot use: training seconds against wall × slots.
    use = OUTCOME["slot_use"]
    assert use["slots"] >= 1 and use["busy_s"] > 0 and use["wall_s"] > 0
    assert 0 < use["share"] <= 1
    assert use["share"] == pytest.approx(min(1.0, use["busy_s"] / (use["wall_s"] * use["slots"])))


def test_sync_sweep_halves_then_keeps_one(finished_sweep: Path) -> None:
    # Sync mode: 4 trials → 2 kept at t̂ = 0.2 → exactly 1 kept at 0.4, which completes.
    state = json.loads((finished_sweep / "scheduler_state.json").read_text())
    rungs = state["rungs"]
    assert [r["decided"] for r in rungs] == [True, True]
    assert len(rungs[0]["survivors"]) == 2 and len(rungs[1]["survivors"]) == 1
    statuses = sorted(t["status"] for t in state["trials"].values())
    assert statuses == ["completed", "stopped", "stopped", "stopped"]
    survivor = rungs[1]["survivors"][0]
    assert state["trials"][survivor]["status"] == "completed"
    stopped_at = sorted(t["stopped_at"] for t in state["trials"].values() if t["status"] == "stopped")
    assert stopped_at == [0.2, 0.2, 0.4]


def test_early_answer_written(finished_sweep: Path) -> None:
    # predicted_best.json names the survivor, its predicted final ± σ and the compute spent.
    answer = json.loads((finished_sweep / "predicted_best.json").read_text())
    state = json.loads((finished_sweep / "scheduler_state.json").read_text())
    assert answer["trial_id"] == state["rungs"][-1]["survivors"][0]
    assert answer["predicted_final_loss"] > 0 and answer["uncertainty"] >= 0
    # Decided at 0.4: 4×0.2 + 2×0.2 (+ overshoot of one log interval) of 4 trials' compute.
    assert 0.25 < answer["compute_fraction"] < 0.5
    assert "lr" in answer["config"]


def test_mlflow_parent_and_children(finished_sweep: Path) -> None:
    # One parent run, one nested child per trial with params and a status tag.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{finished_sweep / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-test")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 4
    tags = sorted(r.data.tags["status"] for r in children)
    assert tags == ["completed", "stopped_at_0.2", "stopped_at_0.2", "stopped_at_0.4"]
    for child in children:
        for key in ("eta", "batch_size", "weight_decay", "tau", "tokens_per_param", "n_params",
                    "total_tokens", "schedule", "seed"):
            assert key in child.data.params, key
        assert "train_loss" in child.data.metrics
        assert "lr" in child.data.params  # the searched key under its YAML name, as in the report
        if child.data.tags["status"] == "completed":
            assert child.data.metrics["final_loss"] > 0
        else:
            assert "final_loss" not in child.data.metrics
    assert parents[0].data.tags.get("predicted_best.trial_id")
    # The MLflow UI opens on the sweep: the experiment is model training (runs page, not the
    # GenAI overview), children are named by their config, every scheduler setting is a param,
    # and the parent's description and metrics hold the early answer and the rung table.
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    assert sorted(c.info.run_name for c in children) == ["lr=0.0025", "lr=0.01", "lr=0.04", "lr=0.16"]
    parent = parents[0].data
    for key in ("scheduler.rule", "scheduler.rule.margin_z", "scheduler.reduction_factor", "scheduler.tolerance",
                "scheduler.rungs"):
        assert key in parent.params, key
    answer = json.loads((finished_sweep / "predicted_best.json").read_text())
    note = parent.tags["mlflow.note.content"]
    assert f"trial {answer['trial_id']}" in note and "| rung t̂ |" in note
    assert parent.tags["predicted_best.answer"].splitlines()[0] in note
    assert parent.metrics["pick_predicted_final_loss"] == pytest.approx(answer["predicted_final_loss"])
    assert 0 < parent.metrics["compute_used"] < 1
    survivor = next(c for c in children if c.data.tags["status"] == "completed")
    assert survivor.data.tags["trial_id"] == answer["trial_id"]  # the pick trained to the end
    assert parent.metrics["pick_final_loss"] == pytest.approx(survivor.data.metrics["final_loss"], abs=1e-6)
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "report" in artifacts and "scheduler_state.json" in artifacts


def test_report_written(finished_sweep: Path) -> None:
    # The report folder holds the table (csv, md) and the three plots.
    report = finished_sweep / "report"
    for name in ("report.csv", "report.md", "curves.png", "normalized.png", "regret.png"):
        assert (report / name).exists(), name


def test_resolved_config_saved_with_absolute_paths(finished_sweep: Path) -> None:
    # sweep.yaml records where the sweep lives, so `hpo resume` works from anywhere.
    saved = yaml.safe_load((finished_sweep / "sweep.yaml").read_text())
    assert Path(saved["output_dir"]).is_absolute() and Path(saved["predictor"]).exists()


def test_a_sweep_where_every_trial_diverged_fails_and_says_so(tmp_path: Path) -> None:
    # Every trial diverges in its first interval: `hpo sweep` exits non-zero saying so, the
    # terminal summary lists each diverged trial, and the MLflow parent run is FAILED.
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    output = tmp_path / "out"
    sweep = tiny_sweep(output)
    sweep["search_space"] = {"lr": {"grid": [10.0, 100.0]}}
    config = tmp_path / "diverge.yaml"
    config.write_text(yaml.safe_dump(sweep))
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "hpo.service.cli", "sweep", str(config)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "every trial diverged (2 of 2)" in run.stderr
    diverged_lines = [line for line in run.stdout.splitlines() if line.startswith("diverged: trial")]
    assert len(diverged_lines) == 2 and any("lr=10" in line for line in diverged_lines)
    client = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny-test").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.info.status == "FAILED"
    assert sorted(r.data.tags["status"] for r in runs if r is not parent) == ["diverged", "diverged"]


def test_an_occupied_output_dir_says_whether_resume_applies(tmp_path: Path) -> None:
    # The same config again: `hpo resume` continues it. Another config into the same folder:
    # resume would continue the old config, so the message names what differs and points to
    # --output instead. Nothing is written either way.
    from hpo.common.overrides import ConfigError
    from hpo.service.sweep import prepare_output, preflight_sweep

    from hpo.service.sweep import STATE_FILE

    output = tmp_path / "out"
    prepare_output(load_sweep_config(data=tiny_sweep(output)))
    # A start that failed before the scheduler or Ray saved anything: the same sweep may start again.
    assert preflight_sweep(load_sweep_config(data=tiny_sweep(output))) == output
    (output / STATE_FILE).write_text("{}")  # the scheduler saved its decisions: the sweep started
    before = sorted(p.name for p in output.iterdir())
    with pytest.raises(ConfigError, match=r"continue it with `hpo resume .*out`"):
        preflight_sweep(load_sweep_config(data=tiny_sweep(output)))
    changed = tiny_sweep(output)
    changed["search_space"] = {"lr": {"grid": [0.001, 0.01]}}
    changed["scheduler"]["rungs"] = [0.1, 0.3]
    with pytest.raises(ConfigError, match=r"with another config \(differs in scheduler.rungs, search_space.lr.grid\)"
                                          r".*--output DIR"):
        preflight_sweep(load_sweep_config(data=changed))
    assert sorted(p.name for p in output.iterdir()) == before


def test_the_readme_output_tree_names_everything_a_sweep_writes(finished_sweep: Path) -> None:
    # README "On disk: what a sweep writes" lists every file and folder of a sweep's output.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tree = readme.split("### On disk: what a sweep writes", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[\w.\-]+/?", tree))
    written = sorted(p.name + ("/" if p.is_dir() else "") for p in finished_sweep.iterdir())
    missing = [name for name in written if name not in named and name.rstrip("/") not in named]
    assert not missing, f"README's output tree leaves out {missing}"
    report = sorted(p.name for p in (finished_sweep / "report").iterdir())
    assert not [name for name in report if name not in named], report


def _rendered_text(url: str, chromium: str) -> str:
    """The text of ``url`` as a browser renders it (headless Chromium; scripts run, then the
    DOM is read), without markup, styles and scripts."""
    import subprocess

    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                          "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    dom = re.sub(r"(?s)<(script|style)[^>]*>.*?</\1>", " ", dom)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


@pytest.mark.slow
def test_the_mlflow_ui_opens_on_the_sweep_in_a_browser(finished_sweep: Path) -> None:
    # What a user sees in a real browser on `mlflow ui` over the sweep's store, at the link the
    # sweep prints: the runs table (not MLflow's GenAI overview) with the sweep's parent run, and
    # on the parent's page the early answer, the answer's metrics, margin_z and the children
    # named by their config. Chromium is installed by .ci/run (Debian's `chromium`).
    import shutil
    import socket
    import subprocess
    import time
    import urllib.request

    from hpo.tracking.uri import experiment_page

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    where = OUTCOME["mlflow"]
    ui = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(["mlflow", "ui", "--backend-store-uri", where["tracking_uri"], "--port", str(port),
                               "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{ui}/health", timeout=3).read()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "mlflow ui did not start"
                time.sleep(1)
        page = experiment_page(ui, where["experiment_id"])
        assert page in where["text"].replace("127.0.0.1:5000", f"127.0.0.1:{port}")
        runs = _rendered_text(page, chromium)
        assert "Run Name" in runs and "matching runs" in runs and "tiny" in runs, runs[:2000]
        assert "Latency" not in runs  # the GenAI overview is not where it opens

        import mlflow

        parent = mlflow.MlflowClient(where["tracking_uri"]).search_runs(
            [where["experiment_id"]], filter_string="tags.collapse_hpo.kind = 'sweep'")[0]
        answer = json.loads((finished_sweep / "predicted_best.json").read_text())
        text = _rendered_text(f"{ui}/#/experiments/{where['experiment_id']}/runs/{parent.info.run_id}"
                              "?workflowType=machine_learning", chromium)
        assert f"Early answer (at {100 * answer['rung']:.0f}% of training): trial {answer['trial_id']}" in text
        assert "pick_predicted_final_loss" in text and "compute_used" in text and "scheduler.rule.margin_z" in text
        assert "Child runs" in text and all(name in text for name in ("lr=0.0025", "lr=0.01", "lr=0.04", "lr=0.16"))
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_tracking_credentials_reach_the_driver_but_no_ray_process(tmp_path: Path, monkeypatch) -> None:
    # A password in an http tracking URI: MLflow in the driver gets it (its environment
    # variables); no process of the local Ray the sweep starts holds it in /proc/<pid>/environ.
    import os

    import ray

    from hpo.service.sweep import start_ray_then_credentials
    from hpo.trials.sweep_config import load_sweep_config

    secret = "pw-only-for-the-driver"
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    config = load_sweep_config(data={**tiny_sweep(tmp_path / "out"),
                                     "mlflow": {"experiment": "x", "tracking_uri": f"http://alice:{secret}@127.0.0.1:9"}})
    before = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    try:
        uri = start_ray_then_credentials(config, None)

        @ray.remote
        def worker_pid() -> int:  # a worker process started by the raylet
            return os.getpid()

        worker = ray.get(worker_pid.remote())
        started = {int(p) for p in os.listdir("/proc") if p.isdigit()} - before
        leaked = []
        for pid in started | {worker}:
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            if secret.encode() in environ:
                leaked.append(open(f"/proc/{pid}/cmdline", "rb").read()[:80])
        assert worker in started and len(started) >= 3  # GCS, raylet, worker(s) at least
        assert leaked == []
        assert uri == "http://127.0.0.1:9" and os.environ["MLFLOW_TRACKING_PASSWORD"] == secret
    finally:
        ray.shutdown()


def test_a_disk_without_room_for_the_checkpoints_is_refused_before_ray(tmp_path: Path, monkeypatch) -> None:
    import shutil
    from collections import namedtuple

    from hpo.common.overrides import ConfigError
    from hpo.service.sweep import check_disk_space

    config = load_sweep_config(data=tiny_sweep(tmp_path / "out"))
    check_disk_space(config, config.output_path())  # this machine's disk has room
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 2**20, 2**20))  # 1 MB free
    with pytest.raises(ConfigError, match=r"output_dir: .*out: 1.0 MB free on its filesystem .* needs about \d+ MB "
                                          r"\(4 trial\(s\) x 3 checkpoints"):
        check_disk_space(config, config.output_path())
    assert not (tmp_path / "out").exists()
