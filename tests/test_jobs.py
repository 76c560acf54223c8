"""Sweeps as Ray Jobs against a real Ray head (dashboard + Jobs API) and a real `mlflow server`.

A client here shares no filesystem path with the sweep except where a test reads the sweep's
own outputs to check what the client printed (``predicted_best.json``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cluster_fixtures import MlflowServer, RayCluster, seen_from_another_machine, service_env

#: The packaged quickstart cut down to the tiny sweep of the pipeline tests (4 LRs, rungs
#: 0.2/0.4, margin 0: 4 → 2 → 1), seconds per trial on one core.
CUT_DOWN = ["trainer.tokens_per_param=4", "search_space.lr.grid=[0.0025,0.01,0.04,0.16]",
            "scheduler.rungs=[0.2,0.4]", "scheduler.margin=0", "trainer.log_every=5",
            "trainer.eval_every=100", "trainer.eval_tokens=8192", "trainer.threads=1"]


def hpo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo.service.cli", *args], env=service_env(), capture_output=True,
                          text=True, timeout=timeout)


def sets(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("jobs")
    cluster, server = RayCluster(num_cpus=2), MlflowServer(root / "mlflow")
    try:
        cluster.start()
        server.start()
        yield cluster, server, root / "storage"
    finally:
        server.stop()
        cluster.stop()


def cluster_args(cluster: RayCluster, server: MlflowServer) -> list[str]:
    return ["--address", cluster.dashboard, "--tracking-uri", server.uri]


def submit(cluster: RayCluster, server: MlflowServer, storage: Path, *extra: str) -> str:
    run = hpo("submit", "quickstart", *sets(CUT_DOWN), *extra, "--storage", str(storage),
              *cluster_args(cluster, server))
    assert run.returncode == 0, run.stderr[-3000:]
    job = run.stdout.split("job: ", 1)[1].split()[0]
    assert f"/#/jobs/{job}" in run.stdout and f"{server.uri}/#/experiments/" in run.stdout
    return job


def status(cluster: RayCluster, server: MlflowServer, job: str) -> dict[str, Any]:
    run = hpo("status", job, "--json", *cluster_args(cluster, server))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def poll(cluster: RayCluster, server: MlflowServer, job: str, until, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.time() + timeout_s
    while True:
        state = status(cluster, server, job)
        if until(state):
            return state
        assert time.time() < deadline, f"timed out; last status {state}"
        time.sleep(4)  # each `hpo status` costs a few CPU seconds the sweep's trials also need


def job_ids(cluster: RayCluster) -> list[str]:
    probe = ("from ray.job_submission import JobSubmissionClient as C; "
             f"print(' '.join(j.submission_id or '' for j in C({cluster.dashboard!r}).list_jobs()))")
    run = subprocess.run([sys.executable, "-c", probe], env=service_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


# ----------------------------------------------------------------------------- without a cluster


def test_unreachable_head_and_tracking_server_are_named_within_10_s(tmp_path: Path) -> None:
    # A port nobody listens on, and one that accepts connections but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            refused = f"http://127.0.0.1:{closed.getsockname()[1]}"
        for args, words in (
            (["status", "--address", refused], "Ray head unreachable"),
            (["answer", "somejob", "--address", mute, "--tracking-uri", mute], "Ray head unreachable"),
            (["submit", "quickstart", "--storage", str(tmp_path), "--address", refused, "--tracking-uri", mute],
             "MLflow tracking server unreachable"),
        ):
            started = time.monotonic()
            run = hpo(*args)
            took = time.monotonic() - started
            assert run.returncode == 2, (args, run.stderr[-2000:])
            assert words in run.stderr and "Traceback" not in run.stderr, run.stderr
            assert took < 10, (args, took)


def test_a_server_reached_from_another_machine_is_refused_in_one_line_until_its_host_is_allowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The README's cluster server, reached as a second machine reaches it (by this machine's
    # address, or its name): /health answers 200 but every API call is a 403 "Invalid Host
    # header". Refused up front, in one line naming the server and the fix, exit 2.
    from mlflow.tracking import MlflowClient

    from hpo.tracking.uri import check_tracking_uri

    bind, host = seen_from_another_machine()
    default, allowed = MlflowServer(tmp_path / "default", host=bind), MlflowServer(tmp_path / "allowed", host=bind)
    allowed.allowed_hosts = f"{host}:{allowed.port}"  # the README's fix
    try:
        default.launch(), allowed.launch()
        default.wait(), allowed.wait()
        refused = f"http://{host}:{default.port}"
        run = hpo("submit", "quickstart", "--storage", str(tmp_path / "storage"), "--address", "http://127.0.0.1:9",
                  "--tracking-uri", refused)
        assert run.returncode == 2, run.stderr[-3000:]
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and refused in lines[0], run.stderr
        assert "HTTP 403" in lines[0] and f"--allowed-hosts {host}:{default.port}" in lines[0], lines[0]
        # (`hpo sweep` runs the same check: hpo.service.sweep.preflight_portable, as `hpo submit` does.)
        # Started with --allowed-hosts HOST:PORT, the same machine's requests are served.
        uri = f"http://{host}:{allowed.port}"
        check_tracking_uri(uri)
        assert MlflowClient(tracking_uri=uri).create_experiment("from-another-machine")
        # `hpo stop` ends a sweep's runs on such a server with its one line only: MLflow's two
        # "View run/experiment at" lines per ended run (14 lines for 6 trials) are not printed.
        from hpo.tracking.cluster import tracking_client
        from hpo.tracking.runs import record_stop

        monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
        client = tracking_client(uri)
        experiment = client.get_experiment_by_name("from-another-machine").experiment_id
        parent = client.create_run(experiment).info.run_id
        client.create_run(experiment, tags={"mlflow.parentRunId": parent})
        capsys.readouterr()
        assert record_stop(client, parent, {"job_id": "x"}) == 2
        assert capsys.readouterr().out == ""
    finally:
        default.stop()
        allowed.stop()


def test_an_invalid_host_refusal_met_after_the_check_is_one_line_too(monkeypatch, capsys) -> None:
    # A server that starts refusing mid-run (restarted with other --allowed-hosts): MLflow's
    # client raises; the CLI prints the same one line instead of the traceback.
    import hpo.service.cli as cli

    def refuse(args) -> int:
        raise RuntimeError("API request to endpoint /api/2.0/mlflow/runs/create failed with error code 403 != 200. "
                           "Response body: 'Invalid Host header - possible DNS rebinding attack detected'")

    monkeypatch.setattr(cli, "_cmd_stop", refuse)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:secret@mlflow.example.org:5000")
    assert cli.main(["stop", "somejob"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--allowed-hosts mlflow.example.org:5000" in err[0] and "secret" not in err[0], err


def test_address_forms_and_the_error_line_of_a_failed_job() -> None:
    from hpo.tracking.cluster import ClusterError, dashboard_url
    from hpo.service.jobs import last_error_line

    assert dashboard_url("head:8265") == "http://head:8265"
    assert dashboard_url("https://head:8265/") == "https://head:8265"
    with pytest.raises(ClusterError, match="dashboard's HTTP address"):
        dashboard_url("ray://head:10001")
    # Our CLI's one-line error wins over what follows it; else a traceback's last line.
    assert last_error_line("x\nerror: output_dir: cannot create /a\n\nbye\n") == "error: output_dir: cannot create /a"
    assert last_error_line("Traceback (most recent call last):\n  File x\nValueError: boom\n") == "ValueError: boom"
    assert last_error_line("") is None


def test_storage_must_be_an_absolute_path_the_nodes_mount(tmp_path: Path) -> None:
    # Checked before anything else is contacted: exit 2, one line naming the option.
    for storage in ("relative/dir", "s3://bucket/sweeps"):
        run = hpo("submit", "quickstart", "--storage", storage, "--address", "http://127.0.0.1:9",
                  "--tracking-uri", "http://127.0.0.1:9")
        assert run.returncode == 2 and run.stderr.strip().startswith("error: --storage:"), run.stderr


def test_the_job_working_dir_carries_the_validated_config_and_a_custom_predictor(tmp_path: Path) -> None:
    import yaml

    from hpo.data import default_predictor_path, sweep_config_path
    from hpo.service.jobs import JOB_FILES, _job_files
    from hpo.trials.sweep_config import load_sweep_config

    shipped = tmp_path / "checkout"
    (shipped / ".git").mkdir(parents=True)
    (shipped / "corpus.txt").write_text("text")
    predictor = tmp_path / "mine.json"
    predictor.write_bytes(default_predictor_path().read_bytes())
    config = load_sweep_config(sweep_config_path("quickstart"), overrides=(f"predictor={predictor}",))
    root = tmp_path / "job"
    _job_files(config, "/shared/j1", "http://user:secret@mlflow:5000", str(shipped), root)
    assert (root / "corpus.txt").exists() and not (root / ".git").exists()
    sent = yaml.safe_load((root / JOB_FILES / "sweep.yaml").read_text())
    assert sent["output_dir"] == "/shared/j1" and sent["predictor"] == f"{JOB_FILES}/predictor.json"
    assert sent["mlflow"]["tracking_uri"] == "http://mlflow:5000"  # no password leaves the client
    assert (root / JOB_FILES / "predictor.json").read_bytes() == predictor.read_bytes()
    # What the cluster loads is what the client validated.
    again = load_sweep_config(root / JOB_FILES / "sweep.yaml")
    assert again.search_space == config.search_space and again.scheduler == config.scheduler


# ----------------------------------------------------------------------------- real head + server


def test_bad_config_fails_on_the_client_before_anything_is_submitted(services) -> None:
    cluster, server, storage = services
    before = job_ids(cluster)
    run = hpo("submit", "quickstart", "--set", "scheduler.rungs=[0.3,0.2]", "--storage", str(storage),
              *cluster_args(cluster, server))
    # The message `hpo sweep` gives for the same config, exit 2, and no job on the cluster.
    same = hpo("sweep", "quickstart", "--set", "scheduler.rungs=[0.3,0.2]", "--output", str(storage / "never"))
    assert run.returncode == 2 and same.returncode == 2
    assert "scheduler.rungs" in run.stderr and run.stderr.strip() == same.stderr.strip()
    assert job_ids(cluster) == before
    assert not storage.exists()


def test_submit_watch_answer_and_stop_after_the_end(services) -> None:
    cluster, server, storage = services
    job = submit(cluster, server, storage)
    # `status` shows the published rung progress and, once made, the early answer.
    state = poll(cluster, server, job, lambda s: (s["published"] or {}).get("early_answer"))
    assert state["state"] in ("RUNNING", "SUCCEEDED")
    progress = state["published"]["progress"]
    assert [r["fraction"] for r in progress["progress"]] == [0.2, 0.4]
    assert progress["progress"][0]["reached"] == 4 and progress["progress"][0]["decided"]
    assert 0 < progress["compute_fraction"] < 1

    answer = hpo("answer", job, "--json", *cluster_args(cluster, server))
    assert answer.returncode == 0, answer.stderr[-2000:]
    assert json.loads(answer.stdout) == json.loads((storage / job / "predicted_best.json").read_text())
    text = hpo("answer", job, "--no-wait", *cluster_args(cluster, server))
    assert text.returncode == 0 and "predicted final loss" in text.stdout and "P(best): " in text.stdout

    done = poll(cluster, server, job, lambda s: s["state"] in ("SUCCEEDED", "FAILED", "STOPPED"))
    assert done["state"] == "SUCCEEDED" and done["published"]["status"] == "FINISHED"
    # Each rung decision was published as its own artifact on the parent run.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    files = {f.path for f in client.list_artifacts(done["published"]["run_id"], "collapse_hpo")}
    assert {"collapse_hpo/rung_0.json", "collapse_hpo/rung_1.json", "collapse_hpo/early_answer.json"} <= files
    text = hpo("status", *cluster_args(cluster, server))
    assert job in text.stdout and "rung t̂ = 0.2 (decided): 4 reached" in text.stdout
    assert "Early answer (at 40% of training)" in text.stdout and "[bold" not in text.stdout
    # The monitor's verdicts (issue 26): status counts the sweep's trials and names any in alarm;
    # `hpo monitor --job` reads those same trials' curves from MLflow.
    assert done["monitor"]["trials"] == 4 and len(done["monitor"]["last_residual"]) >= 1
    assert "  monitor: " in text.stdout
    watched = hpo("monitor", "--job", job, "--json", *cluster_args(cluster, server))
    assert watched.returncode == 0, watched.stderr[-2000:]
    rows = json.loads(watched.stdout)["runs"]
    children = client.search_runs([client.get_run(done["published"]["run_id"]).info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{done['published']['run_id']}'")
    assert sorted(r["run_id"] for r in rows) == sorted(c.info.run_id for c in children)
    assert {r["status"] for r in rows} <= {"aligning", "ok", "alarm"} and any(r["status"] != "aligning" for r in rows)

    logs = hpo("logs", job, *cluster_args(cluster, server))
    assert logs.returncode == 0 and "Early answer" in logs.stdout
    # MLflow's own "View run ... at" line per ended run is kept out; the sweep says where once.
    assert "View run" not in logs.stdout and "reuse these curves" in logs.stdout
    followed = hpo("logs", job, "--follow", *cluster_args(cluster, server), timeout=60)  # returns: the job ended
    assert followed.returncode == 0 and "Early answer" in followed.stdout
    stop = hpo("stop", job, *cluster_args(cluster, server))
    assert stop.returncode == 0 and "already ended (SUCCEEDED)" in stop.stdout
    assert client.get_run(done["published"]["run_id"]).info.status == "FINISHED"


def test_a_failing_job_shows_its_last_error_line(services, tmp_path: Path) -> None:
    cluster, server, _ = services
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # Valid on the client; on the cluster the output directory cannot be created.
    job = submit(cluster, server, blocker)
    state = poll(cluster, server, job, lambda s: s["state"] in ("SUCCEEDED", "FAILED", "STOPPED"), timeout_s=120)
    assert state["state"] == "FAILED"
    assert state["error"].startswith("error: output_dir:") and str(blocker) in state["error"]
    text = hpo("status", job, *cluster_args(cluster, server))
    assert f"error: {state['error']}" in text.stdout
    answer = hpo("answer", job, *cluster_args(cluster, server))
    assert answer.returncode == 1 and "without an early answer" in answer.stderr


@pytest.mark.slow
def test_stop_a_running_job_ends_its_mlflow_runs_killed(services) -> None:
    cluster, server, storage = services
    # A longer sweep (the quickstart's own length), stopped while its trials train.
    run = hpo("submit", "quickstart", "--set", "trainer.threads=1", "--storage", str(storage),
              *cluster_args(cluster, server))
    assert run.returncode == 0, run.stderr[-3000:]
    job = run.stdout.split("job: ", 1)[1].split()[0]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)

    def training(state: dict) -> bool:
        published = state["published"]
        return bool(published) and bool(client.search_runs(
            [client.get_run(published["run_id"]).info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{published['run_id']}'"))

    state = poll(cluster, server, job, training, timeout_s=180)
    assert state["state"] == "RUNNING"
    stop = hpo("stop", job, *cluster_args(cluster, server))
    assert stop.returncode == 0 and "ended KILLED" in stop.stdout, stop.stderr[-2000:]
    after = status(cluster, server, job)
    assert after["state"] == "STOPPED" and after["published"]["status"] == "KILLED"
    assert after["published"]["stopped"]["job_id"] == job and after["published"]["stopped"]["by"]
    parent = after["published"]["run_id"]
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert children and all(c.info.status != "RUNNING" for c in children)
    assert "KILLED" in {c.info.status for c in children}
    again = hpo("stop", job, *cluster_args(cluster, server))
    assert again.returncode == 0 and "already ended (STOPPED)" in again.stdout
    answer = hpo("answer", job, "--no-wait", *cluster_args(cluster, server))
    assert answer.returncode in (0, 1)  # stopped before or after its early answer: never "still running"


@pytest.mark.slow
def test_a_job_on_two_nodes_runs_trials_on_both(tmp_path: Path) -> None:
    cluster, server = RayCluster(num_cpus=1), MlflowServer(tmp_path / "mlflow")
    try:
        cluster.start()
        cluster.add_worker(num_cpus=1)
        server.start()
        job = submit(cluster, server, tmp_path / "storage")
        done = poll(cluster, server, job, lambda s: s["state"] in ("SUCCEEDED", "FAILED", "STOPPED"))
        assert done["state"] == "SUCCEEDED", hpo("logs", job, *cluster_args(cluster, server)).stdout[-4000:]
        assert done["published"]["early_answer"]
        # The trials' actors of this job, by node: both nodes trained.
        probe = ("from ray.util.state import list_actors; "
                 f"a = list_actors(address={cluster.dashboard!r}, limit=1000, detail=True); "
                 "print(sorted({(x.class_name, x.node_id) for x in a})); "
                 "print(len({x.node_id for x in a if 'Trainable' in (x.class_name or '')}))")
        run = subprocess.run([sys.executable, "-c", probe], env=service_env(), capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
        assert int(run.stdout.strip().splitlines()[-1]) == 2, run.stdout
    finally:
        server.stop()
        cluster.stop()
