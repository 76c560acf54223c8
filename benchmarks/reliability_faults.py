"""Faults a team meets on a cluster, for ``benchmarks/reliability.py``'s "Cluster faults" section:

1. **the MLflow tracking server stopped for 60 s mid-sweep, then restarted** (:func:`server_outage`);
2. **a Ray worker node killed under a submitted job** (:func:`worker_node_kill`);
3. **the driver killed while it writes the scheduler state** (:func:`kill_state_writer`, SIGKILL of a
   process writing ``scheduler_state.json`` and its history log in a loop; and the real sweep driver
   SIGKILLed the moment a state write is under way, then resumed: :data:`WRITING_STATE`).

Each reports what was lost (must be nothing): runs, metric points and tags missing or doubled in
MLflow, decisions that differ from the uninterrupted run, work trained twice past a checkpoint,
a state file that does not parse or mixes two versions.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

#: The kill point of ``reliability_runs.kill_and_resume`` that fires while a state write is under way.
WRITING_STATE = "while it writes the scheduler state"


# ----------------------------------------------------------------------------- 3. kill while writing


def _state_version(i: int, n_trials: int) -> Any:
    """Version ``i`` of a scheduler state of ``n_trials`` trials: every trial's config and the
    settings carry ``i``, so a file mixing two versions shows as a mismatch."""
    from hpo.decisions.scheduler_state import RungRecord, SchedulerState, TrialRecord

    trials = {f"t{k}": TrialRecord(trial_id=f"t{k}", order=k, config={"lr": 1e-3 * (k + 1), "version": i},
                                   status="running", last_train_fraction=0.01 * (i % 100))
              for k in range(n_trials)}
    return SchedulerState(settings={"rungs": [0.5], "decision_mode": "sync", "version": i}, trials=trials,
                          rungs=[RungRecord(index=0, fraction=0.5)], experiment_id="kill-test")


def _write_forever(path: Path, start: int, n_trials: int) -> None:
    """The child: from version ``start`` on, one history point and one forced snapshot per version,
    as the scheduler's StateStore writes them (history flushed first), until it is killed."""
    from hpo.decisions.scheduler_state import StateStore

    store = StateStore(path, interval_s=0.0)
    store.started = start > 0  # a resumed writer appends to the history log
    i = start
    while True:
        store.append(f"t{i % n_trials}", 0.001 * (i + 1), float(i))
        store.save(_state_version(i, n_trials), force=True, strict=True)
        i += 1


def kill_state_writer(folder: Path, rounds: int, n_trials: int = 300, seed: int = 0,
                      max_delay_s: float = 0.08) -> dict[str, Any]:
    """``rounds`` times: fork a process that writes the state in a loop (continuing the version on
    disk), SIGKILL it after a random delay, then read what is on disk. Counts the kills that landed
    during a snapshot write (its temporary file left behind), states that failed to parse, states
    that mix versions, and history points lost (every version up to the one on disk has its point:
    the log is written before each snapshot)."""
    from hpo.decisions.scheduler_state import SchedulerState, StateStore

    rng = random.Random(seed)
    path = Path(folder) / "scheduler_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = {"kills": 0, "mid_write": 0, "unreadable": 0, "mixed": 0, "went_back": 0, "points_lost": 0,
              "versions_written": 0}
    errors: list[str] = []
    on_disk = -1
    for _ in range(rounds):
        start = on_disk + 1
        pid = os.fork()
        if pid == 0:  # the writer: never returns into the test runner
            try:
                _write_forever(path, start, n_trials)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, max_delay_s))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        counts["kills"] += 1
        left = list(path.parent.glob(f".{path.name}.*.tmp"))
        counts["mid_write"] += bool(left)
        if not path.exists():
            continue  # killed before the first snapshot
        try:
            state = SchedulerState.load(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable state is the result being measured
            counts["unreadable"] += 1
            errors.append(str(exc)[:200])
            continue
        version = state.settings.get("version")
        if any(rec.config.get("version") != version for rec in state.trials.values()) or len(state.trials) != n_trials:
            counts["mixed"] += 1
            continue
        if version < on_disk:
            counts["went_back"] += 1
        on_disk = max(on_disk, version)
        points = {int(value) for rec in state.trials.values() for _, value in rec.history}
        counts["points_lost"] = len(set(range(version + 1)) - points)
        StateStore(path, interval_s=0.0).load(state.settings, "kill-test")  # as a resumed driver does
    counts["versions_written"] = on_disk + 1
    counts["tmp_left_after_resume"] = len(list(path.parent.glob(f".{path.name}.*.tmp")))
    return {**counts, "errors": errors[:3], "rounds": rounds, "n_trials": n_trials}


# ----------------------------------------------------------------------------- shared


def _lines(path: Path) -> int:
    try:
        return sum(1 for _ in open(path, encoding="utf-8"))
    except OSError:
        return 0


def _tiny_config(folder: Path, code: Any, tracking_uri: str, experiment: str, cluster: bool = False) -> Path:
    """The tiny sweep's config logging to ``experiment`` at ``tracking_uri`` (``cluster``: without the
    local Ray settings, for ``hpo submit``)."""
    import yaml
    import reliability_runs as rel

    path = rel._sweep_config(folder, code)
    config = yaml.safe_load(path.read_text())
    config["mlflow"] = {"experiment": experiment, "tracking_uri": tracking_uri}
    if cluster:
        config.pop("ray", None)
    path.write_text(yaml.safe_dump(config))
    return path


def _parent_tags(tracking_uri: str, experiment: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    parents = [r for r in client.search_runs([found.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    return dict(parents[0].data.tags) if len(parents) == 1 else {}


def _points_between(tracking_uri: str, experiment: str, start_ms: int, end_ms: int) -> int:
    """Metric points of the trial runs logged (by their timestamp) between ``start_ms`` and ``end_ms``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    return sum(start_ms <= m.timestamp <= end_ms for r in client.search_runs([found.experiment_id])
               if "mlflow.parentRunId" in r.data.tags for m in client.get_metric_history(r.info.run_id, "loss"))


def _answer_tags(tags: dict[str, str], ref_answer: str, held: list[str], failed: list[str]) -> None:
    from reliability_concurrency import _label

    named = _label(tags.get("predicted_best.trial_id"))
    ok = tags.get("collapse_hpo.early_answer") == "1" and named == ref_answer and tags.get("collapse_hpo.rungs_decided") == "2"
    (held if ok else failed).append(f"parent tags: early answer {named}, rungs decided "
                                    f"{tags.get('collapse_hpo.rungs_decided')}")


# ----------------------------------------------------------------------------- 1. the tracking server away

#: Seconds the tracking server stays stopped (its restart, a minute or more on a busy machine, adds to it).
OUTAGE_S = 60.0


def server_outage(folder: Path, code: Any, ref: dict[str, Any], ref_answer: str) -> tuple[dict[str, Any], Any]:
    """The tiny sweep logging to a real ``mlflow server``, stopped once the trials have reported a few
    results and restarted (same store, same port) :data:`OUTAGE_S` later. Returns the row and the
    running server (the node-kill case logs to it)."""
    from cluster_fixtures import MlflowServer
    import reliability_concurrency as conc
    import reliability_runs as rel

    began = time.perf_counter()
    held: list[str] = []
    failed: list[str] = []
    server = MlflowServer(folder / "server").start()
    config = _tiny_config(folder, code, server.uri, "outage")
    output = folder / "out"
    pending = output / "mlflow_pending.jsonl"
    driver = conc._start(code, conc._cli("sweep", str(config)), folder)
    try:
        conc._wait(driver, lambda: any((t.get("last_train_fraction") or 0) >= 0.05
                                       for t in rel._state(output).get("trials", {}).values()), "the first results")
        stopped_ms = int(time.time() * 1000)
        server.stop()
        most, ended_during = 0, False
        while time.time() * 1000 - stopped_ms < OUTAGE_S * 1000:
            most = max(most, _lines(pending))
            ended_during = ended_during or driver.poll() is not None
            time.sleep(1)
        server = MlflowServer(folder / "server", port=server.port).launch()
        while server.process.poll() is None:  # the restart: the queue grows until the server answers
            most = max(most, _lines(pending))
            ended_during = ended_during or driver.poll() is not None
            try:
                urllib.request.urlopen(f"{server.uri}/health", timeout=2)  # noqa: S310 - the local server
                break
            except OSError:
                time.sleep(1)
        back_ms = int(time.time() * 1000)
        rc, tail = conc._finish(driver)
    finally:
        conc._stop(driver)
    outage_s = (back_ms - stopped_ms) / 1000
    (held if rc == 0 else failed).append(f"sweep exit {rc}" + ("" if rc == 0 else f": {tail[:120]}")
                                         + (", ended while the server was away" if ended_during else ""))
    held.append(f"server away {outage_s:.0f} s; at most {most} writes waited in the sweep folder")
    left = _lines(pending)
    if left:
        report = subprocess.run(conc._cli("report", str(output)), env=rel._env(code), cwd=folder,
                                capture_output=True, text=True, timeout=900)
        sent = [line for line in report.stdout.splitlines() if line.startswith("MLflow")]
        ok = report.returncode == 0 and not pending.exists()
        (held if ok else failed).append(f"{left} still waiting at the end; `hpo report` exit {report.returncode}: "
                                        f"{(sent or ['(no line)'])[-1][:140]}")
    else:
        held.append("nothing left waiting at the end (sent when the server answered)")
    inside = _points_between(server.uri, "outage", stopped_ms, back_ms)
    (held if inside > 0 else failed).append(f"{inside} loss points logged while the server was away are on it")
    conc._same_sweep(ref, output, held, failed, tracking_uri=server.uri, experiment="outage")
    _answer_tags(_parent_tags(server.uri, "outage"), ref_answer, held, failed)
    return ({"case": f"MLflow server stopped {OUTAGE_S:.0f} s mid-sweep, then restarted", "exits": f"sweep {rc}",
             "held": held, "failed": failed, "seconds": time.perf_counter() - began}, server)


# ----------------------------------------------------------------------------- 2. a worker node killed


def _reported_step(tracking_uri: str, experiment: str, tid: str) -> int:
    """The last step trial ``tid`` reported (its results reach MLflow before the scheduler sees them)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    return max((m.step for r in client.search_runs([found.experiment_id]) if r.data.tags.get("trial_id") == tid
                for m in client.get_metric_history(r.info.run_id, "loss")), default=0)


def _of_node(root: int, needle: str) -> list[tuple[int, str]]:
    """(pid, working directory) of the processes of the node started as ``root`` (its process group,
    or below it in the process tree) whose title holds ``needle``."""
    parent: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue

    def below(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    found = []
    for pid in parent:
        try:
            if not (below(pid) or os.getpgid(pid) == root):
                continue
            title = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in title:
                found.append((pid, os.readlink(f"/proc/{pid}/cwd")))
        except OSError:
            continue
    return found


def worker_node_kill(folder: Path, code: Any, ref: dict[str, Any], ref_answer: str, server: Any) -> dict[str, Any]:
    """The tiny sweep submitted as a Ray Job to a real two-node cluster (``ray start --head`` + one
    worker node, one CPU each, token auth), logging to ``server``; once a trial trains on the worker
    node and has reported past its first checkpoint interval, the whole worker node is SIGKILLed
    (raylet, its agents and workers: a machine lost). Ray Tune retries the trial (``max_failures=1``)
    from its newest checkpoint on the surviving node."""
    from cluster_fixtures import RayCluster, service_env
    import reliability_concurrency as conc
    import reliability_runs as rel

    began = time.perf_counter()
    held: list[str] = []
    failed: list[str] = []
    env = {**service_env(), "PYTHONPATH": str(code.root)}
    cluster = RayCluster(num_cpus=1)
    try:
        cluster.start()
        cluster.add_worker(num_cpus=1)
        config = _tiny_config(folder, code, server.uri, "node-kill", cluster=True)
        storage = folder / "storage"
        submit = subprocess.run(conc._cli("submit", str(config), "--address", cluster.dashboard, "--tracking-uri",
                                          server.uri, "--storage", str(storage)), env=env, capture_output=True,
                                text=True, timeout=600)
        if submit.returncode != 0:
            raise RuntimeError(f"submit failed: {submit.stderr.strip().splitlines()[-1:]}")
        job = submit.stdout.split("job: ", 1)[1].split()[0]
        output = storage / job
        worker_pgid = cluster.nodes[1].pid
        deadline = time.time() + 1800
        victim = None
        seen: set[str] = set()
        import yaml

        log_every = yaml.safe_load(config.read_text())["trainer"]["log_every"]
        min_step = 3 * log_every  # a few intervals trained since its start (or its rung's checkpoint)
        while victim is None:
            if time.time() > deadline or (output / "report").exists():
                raise RuntimeError("no trial trained on the worker node past t̂ = 0.1 before the job ended")
            for pid, cwd in _of_node(worker_pgid, "Trainable.train"):
                tid = cwd.rsplit("_", 2)[-2] + "_" + cwd.rsplit("_", 1)[-1] if cwd.count("_") >= 2 else ""
                if tid not in seen:
                    seen.add(tid)
                    print(f"    trial {tid} trains on the worker node (pid {pid}, in {cwd})", flush=True)
                # Its results reach MLflow before the scheduler sees them (the snapshot is throttled).
                step = _reported_step(server.uri, "node-kill", tid) if tid else 0
                if step >= min_step:
                    victim = (pid, tid, step)
            if victim is None:
                time.sleep(1.0)
        node_processes = _of_node(worker_pgid, "")
        os.killpg(worker_pgid, signal.SIGKILL)
        for pid, _ in node_processes:  # anything of the node's that left its group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cluster.nodes[1].wait()
        tid = victim[1]
        checkpoint = conc._newest_checkpoint(output, tid)
        reported = _reported_step(server.uri, "node-kill", tid)
        held.append(f"killed the worker node under {conc._label(tid)} (at step {reported}, newest checkpoint "
                    f"at step {checkpoint})")
        state = "RUNNING"
        while state not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.time() > deadline:
                raise RuntimeError("the job did not end in 30 min")
            time.sleep(10)
            status = subprocess.run(conc._cli("status", job, "--json", "--address", cluster.dashboard,
                                              "--tracking-uri", server.uri), env=env, capture_output=True,
                                    text=True, timeout=300)
            if status.returncode == 0:
                state = json.loads(status.stdout)["state"]
        (held if state == "SUCCEEDED" else failed).append(f"job {state}")
        errored = any(output.glob(f"ray/*/*{tid}/error.txt"))
        final = rel._state(output).get("trials", {}).get(tid, {}).get("status")
        (held if errored else failed).append(f"{conc._label(tid)} {'errored, retried' if errored else 'no error recorded'}"
                                             f" (max_failures 1), ended {final}")
        # Work trained twice: at most the intervals it had reported past its checkpoint when its
        # node died, plus the one in flight.
        lost = -(-(reported - checkpoint) // log_every)
        conc._same_sweep(ref, output, held, failed, (lost + 1, f"trained again after the retry: the {lost} "
                                                              f"interval(s) reported since the checkpoint at step "
                                                              f"{checkpoint}, and the one in flight"),
                         tracking_uri=server.uri, experiment="node-kill")
        _answer_tags(_parent_tags(server.uri, "node-kill"), ref_answer, held, failed)
        rc = 0 if state == "SUCCEEDED" else 1
    finally:
        cluster.stop()
    return {"case": "Ray worker node SIGKILLed under a submitted job", "exits": f"job {'SUCCEEDED' if rc == 0 else state}",
            "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- 3b. the real driver, mid-write


class _WritingState:
    """A probe, true while a snapshot write of the driver is under way (its temporary file exists),
    armed once a trial has reached the first rung (the snapshot on disk says so, read at most twice a
    second): the writes that follow carry the rung's entries and its decision."""

    def __init__(self) -> None:
        self.armed, self.last_read = False, 0.0

    def __call__(self, output: Path) -> bool:
        import reliability_runs as rel

        if not self.armed:
            if time.monotonic() - self.last_read < 0.5:
                return False
            self.last_read = time.monotonic()
            rungs = rel._state(output).get("rungs") or []
            self.armed = bool(rungs and rungs[0].get("entries"))
            return False
        try:
            return any(n.startswith(".scheduler_state.json.") and n.endswith(".tmp") for n in os.listdir(output))
        except OSError:
            return False


def driver_killed_writing_state(folder: Path, code: Any, ref: dict[str, Any]) -> dict[str, Any]:
    """``hpo sweep`` SIGKILLed (its process group) the moment a state write is seen under way (the
    folder polled without pause), the folder copied and ``hpo resume`` run on the copy; the state
    left on disk must parse, and the resumed sweep match the uninterrupted one."""
    import reliability_runs as rel
    from hpo.decisions.scheduler_state import SchedulerState

    began = time.perf_counter()
    held: list[str] = []
    failed: list[str] = []
    result = rel.kill_and_resume(folder, code, WRITING_STATE, probe=_WritingState(), poll_s=0.0)
    output = folder / "out"
    left = [p.name for p in output.glob(".scheduler_state.json.*.tmp")]
    held.append("killed inside a snapshot write (its temporary file left)" if left
                else "killed just after a snapshot write (no temporary file left)")
    try:
        state = SchedulerState.load(output / "scheduler_state.json")
        decided = sum(r.decided for r in state.rungs)
        entries = len(state.rungs[0].entries) if state.rungs else 0
        held.append(f"state on disk parses: {len(state.trials)} trials, {entries} at the first rung, {decided} "
                    f"rung(s) decided, t̂ ≤ {max((t.last_train_fraction for t in state.trials.values()), default=0):.2f}")
    except Exception as exc:  # noqa: BLE001 - an unreadable state is the result being measured
        failed.append(f"state on disk unreadable: {str(exc)[:120]}")
    (held if result["resume_rc"] == 0 else failed).append(
        f"resume exit {result['resume_rc']}" + (f": {result['resume_tail'][0][:100]}" if result["resume_tail"] else ""))
    c = rel._compare(ref, result)
    for key in ("trials", "decisions"):
        (held if c[key] == "same" else failed).append(f"{key} {c[key]}")
    runs_ok = (result.get("parents"), result.get("children"), result.get("running")) == (ref["parents"], ref["children"], 0)
    (held if runs_ok else failed).append(f"MLflow {c['mlflow']}")
    # Killed between checkpoints, a trial goes back to its newest one: the intervals since (at most
    # the 25 of checkpoint_frequency per trial alive) are trained again, as in the driver-kill rows.
    held.append(f"compute {c['compute']}")
    (held if result["original_untouched"] else failed).append(
        "original folder untouched" if result["original_untouched"] else "the resume wrote into the original")
    return {"case": f"driver SIGKILLed {WRITING_STATE}, then `hpo resume`", "exits": f"resume {result['resume_rc']}",
            "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- before: MLflow's own client

STALLED_WRITE = """
import socket, time
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()  # nothing listens
began = time.time()
try:
    MlflowClient(f"http://127.0.0.1:{port}").log_batch("0" * 32, metrics=[Metric("loss", 1.0, 0, 0)])
    print(f"{time.time() - began:.0f} s, then it returned")
except Exception as exc:
    print(f"{time.time() - began:.0f} s, then {type(exc).__name__}: {str(exc)[:90]}")
"""


def start_stalled_write() -> subprocess.Popen:
    """What a sweep met before the outbox: one write by MLflow's own client, with its default retries,
    to a server that is down (a process of its own, timed alongside the other cases)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    return subprocess.Popen([sys.executable, "-c", STALLED_WRITE], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def stalled_write_row(process: subprocess.Popen, began: float) -> dict[str, Any]:
    out, _ = process.communicate(timeout=1800)
    line = (out.strip().splitlines() or ["(no answer)"])[-1]
    return {"code": "MLflow's client alone (before)", "case": "one write to a stopped server, MLflow's default "
            "retries (`MLFLOW_HTTP_REQUEST_MAX_RETRIES` 7)", "exits": "–", "held": [],
            "failed": [f"the write blocked {line} (a sweep's driver makes its writes from Ray Tune's loop)"],
            "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- the section

SECTION = "## Cluster faults"


def run_section(work: Path, code: Any, ref: dict[str, Any], ref_answer: str, kills: int = 300) -> list[dict[str, Any]]:
    """The faults, one after the other; a case that cannot run is a row that says so."""
    results: list[dict[str, Any]] = []
    server = None
    stalled, stalled_began = start_stalled_write(), time.perf_counter()

    def case(name: str, run: Any) -> None:
        began = time.perf_counter()
        try:
            results.append({"code": code.label, **run()})
        except Exception as exc:  # noqa: BLE001
            results.append({"code": code.label, "case": name, "exits": "n/a", "held": [],
                            "failed": [f"did not run: {exc!r:.200}"], "seconds": time.perf_counter() - began})
        print(f"  {results[-1]['case']}: {'holds' if not results[-1]['failed'] else 'FAILS'} "
              f"({results[-1]['seconds']:.0f} s)", flush=True)

    def outage() -> dict[str, Any]:
        nonlocal server
        row, server = server_outage(work / "outage", code, ref, ref_answer)
        return row

    def writer() -> dict[str, Any]:
        began = time.perf_counter()
        got = kill_state_writer(work / "state-writer", rounds=kills, seed=0)
        ok = got["unreadable"] == got["mixed"] == got["went_back"] == got["points_lost"] == 0
        line = (f"{got['kills']} SIGKILLs of a process writing a {got['n_trials']}-trial state and its history in "
                f"a loop ({got['mid_write']} inside a snapshot write; {got['versions_written']} versions written, "
                f"each round continuing the last); unreadable {got['unreadable']}, two versions mixed "
                f"{got['mixed']}, gone back {got['went_back']}, history points lost {got['points_lost']}; "
                f"temporary files left after a resume {got['tmp_left_after_resume']}")
        return {"case": "state writer SIGKILLed in a loop", "exits": "–", "held": [line] if ok else [],
                "failed": [] if ok else [line], "seconds": time.perf_counter() - began}

    case("MLflow server stopped mid-sweep", outage)
    if server is not None:
        try:
            case("worker node killed", lambda: worker_node_kill(work / "node-kill", code, ref, ref_answer, server))
        finally:
            server.stop()
    case("driver killed while writing the state", lambda: driver_killed_writing_state(work / "writing-state", code, ref))
    case("state writer killed in a loop", writer)
    results.append(stalled_write_row(stalled, stalled_began))
    return results


def section(results: list[dict[str, Any]], ref: dict[str, Any], ref_answer: str, note: str = "") -> list[str]:
    """This section of the report as markdown lines."""
    import reliability_runs as rel
    from hpo.common.tables import markdown_table

    ours = [r for r in results if r["code"] == "this branch"]
    holds = sum(not r["failed"] for r in ours)
    out = [SECTION, "", *([note, ""] if note else []),
           "Faults a team meets on a cluster, with the tiny sweep of the sections above and real services: "
           "`mlflow server` (SQLite backend, its own artifact store) started by the benchmark; a Ray cluster of "
           "`ray start --head` and one worker node (one CPU each, token auth) with the sweep submitted by "
           "`hpo submit`; SIGKILL throughout. Each is compared with the uninterrupted run by the helpers of the "
           "driver-kill section (trial outcomes, rung survivors, MLflow runs and their metric histories, compute "
           "with work trained twice counted twice) and the parent run's answer tags. What was lost is in *did "
           "not hold*: it must be nothing. A trial's MLflow history keeps each step once (a step trained again "
           "after a retry or resume is not logged twice), so *intervals trained twice* there counts duplicate "
           "points, and the work trained again after a kill is bounded instead by the trial's newest checkpoint "
           "at the kill, stated in the row.", "",
           "- *MLflow server stopped*: once the trials have reported, the server is stopped (SIGKILL of its "
           "process group) and started again on the same store and port 60 s later (its start-up adds to the "
           "outage). The sweep's writes wait in `<output>/mlflow_pending.jsonl` and are sent in order when it "
           "answers (or by `hpo report <output>` when the sweep ended first); loss points are counted on the "
           "server by their timestamps inside the outage.",
           "- *Worker node SIGKILLed*: the whole node (raylet, agents, workers) once a trial trains on it past "
           "t̂ = 0.1; Ray Tune retries the trial (`max_failures=1`) from its newest checkpoint on the head.",
           "- *Driver SIGKILLed while it writes the state*: the sweep folder polled without pause until a "
           "snapshot's temporary file exists, then the driver's process group killed, the folder copied and "
           "`hpo resume` run on the copy.",
           "- *State writer SIGKILLed in a loop*: `benchmarks/reliability_faults.kill_state_writer`, the writer "
           "the scheduler uses (`StateStore`: history log, then the snapshot by temporary file, fsync, "
           "`os.replace`), killed at random moments; each round resumes from what is on disk.", "",
           f"Uninterrupted reference: survivors {rel._rungs(ref['decisions'])}, compute "
           f"{100 * ref['compute']:.1f}%, early answer {ref_answer}, {ref['wall_s']:.0f} s. "
           f"**{holds} of {len(ours)} cases hold.** The last row is what a sweep met before: MLflow's own "
           "client, with its default retries, writing to a server that is down.", ""]
    rows = [[r["code"], r["case"], r["exits"], "; ".join(r["held"]) or "–", "; ".join(r["failed"]) or "nothing",
             f"{r['seconds']:.0f}"] for r in results]
    out += [markdown_table(["code", "case", "exits", "held", "did not hold (lost)", "s"], rows), ""]
    return out


def refresh(md: Path, work: Path) -> list[dict[str, Any]]:
    """``--only-faults``: rerun this section (with its own uninterrupted run) into the existing report."""
    from reliability_concurrency import refresh_section

    return refresh_section(md, work, run_section, section, flag="--only-faults", title=SECTION,
                           json_name="faults.json")
