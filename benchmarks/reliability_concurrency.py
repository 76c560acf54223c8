"""Section 4 of ``benchmarks/reliability.md`` (issue 30): concurrent drivers and a killed trial worker.

Real processes, the tiny sweep of the test suite (the one section 1 kills, built by
``reliability._sweep_config``), compared with an uninterrupted run by section 1's helpers
(``reliability._summary`` / ``reliability._compare``):

a. ``hpo resume DIR`` while the ``hpo sweep`` driver on DIR is still running;
b. two ``hpo sweep`` into one output folder, started together;
c. two ``hpo calibrate --from-curves`` (the example curves of the tests) into one output folder;
d. SIGKILL of the Ray worker process training a trial (found in ``/proc`` by its title,
   ``ray::...Trainable.train``, and its working directory, which Ray Tune names after the trial),
   after the trial has reported: before the first rung, and after the early answer half-way
   through the predicted best's training.

Run alone with ``python benchmarks/reliability.py --only-concurrency`` (about five minutes on two
busy cores): it replaces this section of the existing report and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

import reliability_runs as rel
from hpo.common.tables import markdown_table

SECTION = "## Concurrent drivers and a killed trial worker"
TERMINAL = ("stopped", "completed", "diverged")
WORKER_POINTS = ("before the first rung", "after the early answer")


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "hpo.service.cli", *argv]


def _start(code: rel.Code, argv: list[str], cwd: Path) -> subprocess.Popen:
    """``argv`` in its own process group, its output in ``cwd/<command>-<n>.out|.err``."""
    n = len(list(cwd.glob(f"{argv[3]}-*.err")))
    log = cwd / f"{argv[3]}-{n}"
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        process = subprocess.Popen(argv, env=rel._env(code), cwd=cwd, stdout=out, stderr=err, start_new_session=True)
    process.err_path = Path(f"{log}.err")  # type: ignore[attr-defined]
    return process


def _finish(process: subprocess.Popen, timeout: float = 1800) -> tuple[int, str]:
    """Exit status and last stderr line of ``process`` (its process group is killed if it overruns)."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    lines = [line.strip() for line in process.err_path.read_text().splitlines() if line.strip()]
    return process.returncode, (lines[-1] if lines else "")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait(process: subprocess.Popen, probe: Callable[[], Any], what: str) -> Any:
    """The first true value of ``probe()``, polled while ``process`` runs."""
    began = time.perf_counter()
    while True:
        found = probe()
        if found:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"the sweep ended before {what}")
        if time.perf_counter() - began > 1800:
            raise RuntimeError(f"{what} not reached in 30 min")
        time.sleep(0.1)


def _label(tid: Optional[str]) -> str:
    return "trial " + tid.rsplit("_", 1)[-1].lstrip("0") if tid and "_" in tid else str(tid)


def _sha(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def _parents(output: Path, experiment: str = "tiny-test", tracking_uri: Optional[str] = None) -> list[str]:
    """Statuses of the MLflow parent runs of a sweep folder (in its own SQLite store, or at ``tracking_uri``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri or f"sqlite:///{output / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    return [r.info.status for r in runs if "mlflow.parentRunId" not in r.data.tags]


def _same_sweep(ref: dict[str, Any], output: Path, held: list[str], failed: list[str],
                redone: Optional[tuple[int, str]] = None, tracking_uri: Optional[str] = None,
                experiment: str = "tiny-test") -> dict[str, Any]:
    """Section 1's comparison of ``output`` with the uninterrupted run, sorted into held / failed.
    Intervals trained twice must be none, or at most ``redone[0]`` (``redone[1]`` says why). The
    runs are in the folder's SQLite store, or in ``experiment`` at ``tracking_uri``."""
    try:
        got = rel._summary(output, tracking_uri, experiment)
    except Exception as exc:  # noqa: BLE001 - report what broke instead of dying
        failed.append(f"no summary ({exc!r:.80})")
        return {}
    c = rel._compare(ref, got)
    for key in ("trials", "decisions"):
        (held if c[key] == "same" else failed).append(f"{key} {c[key]}")
    runs_ok = (got["parents"], got["children"], got["running"]) == (ref["parents"], ref["children"], 0)
    (held if runs_ok else failed).append(f"MLflow {c['mlflow']}")
    bound, why = redone or (0, "")
    (held if got["repeated"] <= bound else failed).append(f"compute {c['compute']}" + (f"; {why}" if why else ""))
    parents = _parents(output, experiment, tracking_uri)
    (held if parents == ["FINISHED"] else failed).append(f"parent run {'/'.join(parents) or 'missing'}")
    return got


def _busy_line(rc: int, line: str, holder_pid: int, held: list[str], failed: list[str], who: str) -> None:
    named = rc == 2 and f"pid {holder_pid}" in line and "in use by" in line
    (held if named else failed).append(f"{who} exit {rc}" + (", holder named" if named else f": {line[:120]}"))


def _start_sweep(folder: Path, code: rel.Code) -> tuple[Path, Path, float, subprocess.Popen]:
    """The tiny sweep's driver started in ``folder``: its config, output folder, start time, process."""
    config = rel._sweep_config(folder, code)
    began = time.perf_counter()
    return config, folder / "out", began, _start(code, _cli("sweep", str(config)), folder)


# ----------------------------------------------------------------------------- a. resume while the driver runs


def resume_while_running(folder: Path, code: rel.Code, ref: dict[str, Any]) -> dict[str, Any]:
    """``hpo resume`` on the folder of a running ``hpo sweep``, once its trials train."""
    config, output, began, driver = _start_sweep(folder, code)
    held: list[str] = []
    failed: list[str] = []
    try:
        _wait(driver, lambda: any((t.get("last_train_fraction") or 0) >= 0.05
                                  for t in (rel._state(output).get("trials") or {}).values()), "trials trained")
        before = _sha(output / "sweep.yaml")
        second = _start(code, _cli("resume", str(output)), folder)
        rc2, line = _finish(second, timeout=600)
        running = driver.poll() is None
        rc1, tail = _finish(driver)
    finally:
        _stop(driver)
    _busy_line(rc2, line, driver.pid, held, failed, "resume")
    (held if running else failed).append("driver still running after the refusal" if running
                                         else "the driver had ended before the resume answered")
    (held if rc1 == 0 else failed).append(f"driver exit {rc1}" + ("" if rc1 == 0 else f": {tail[:100]}"))
    unchanged = _sha(output / "sweep.yaml") == before
    (held if unchanged else failed).append("sweep.yaml " + ("unchanged" if unchanged else "changed"))
    _same_sweep(ref, output, held, failed)
    return {"case": "`hpo resume DIR` while `hpo sweep` runs on DIR", "exits": f"sweep {rc1}, resume {rc2}",
            "line": line, "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- b. two sweeps into one folder


def two_sweeps(folder: Path, code: rel.Code, ref: dict[str, Any]) -> dict[str, Any]:
    """Two ``hpo sweep`` into one output folder, started together; they differ only in their name,
    so ``sweep.yaml`` tells whose sweep the folder holds."""
    first = rel._sweep_config(folder, code)
    other = yaml.safe_load(first.read_text())
    other["name"] = "tiny-b"
    second = folder / "tiny-b.yaml"
    second.write_text(yaml.safe_dump(other))
    output = folder / "out"
    began = time.perf_counter()
    drivers = {"tiny": _start(code, _cli("sweep", str(first)), folder),
               "tiny-b": _start(code, _cli("sweep", str(second)), folder)}
    try:
        ends = {name: _finish(p) for name, p in drivers.items()}
    finally:
        for p in drivers.values():
            _stop(p)
    held: list[str] = []
    failed: list[str] = []
    winners = [name for name, (rc, _) in ends.items() if rc == 0]
    losers = [name for name, (rc, _) in ends.items() if rc != 0]
    one = len(winners) == 1 and len(losers) == 1
    (held if one else failed).append(f"{len(winners)} ran to the end, {len(losers)} refused")
    line = ""
    if one:
        rc, line = ends[losers[0]]
        _busy_line(rc, line, drivers[winners[0]].pid, held, failed, "second sweep")
        kept = (yaml.safe_load((output / "sweep.yaml").read_text()) or {}).get("name")
        whose = "the winner" if kept == winners[0] else kept
        (held if kept == winners[0] else failed).append(f"sweep.yaml is {whose}'s")
        _same_sweep(ref, output, held, failed)
    exits = ", ".join(f"{name} {rc}" for name, (rc, _) in ends.items())
    return {"case": "two `hpo sweep` into one folder, started together", "exits": exits, "line": line,
            "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- c. two calibrations


def two_calibrations(folder: Path, code: rel.Code) -> dict[str, Any]:
    """Two ``hpo calibrate --from-curves`` into one output folder at once, then a third after them."""
    from mlflow.tracking import MlflowClient

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(rel.REPO_ROOT / "configs" / "curves" / "example_curves.csv", folder / "curves.csv")

    def calibrate(tag: str) -> list[str]:
        return _cli("calibrate", "--from-curves", "curves.csv", "--output-dir", "out",
                    "--predictor-out", f"p{tag}.json")

    began = time.perf_counter()
    both = {tag: _start(code, calibrate(tag), folder) for tag in ("A", "B")}
    try:
        ends = {tag: _finish(p, timeout=600) for tag, p in both.items()}
    finally:
        for p in both.values():
            _stop(p)
    later = subprocess.run(calibrate("C"), env=rel._env(code), cwd=folder, capture_output=True, text=True, timeout=600)
    held: list[str] = []
    failed: list[str] = []
    winners = [tag for tag, (rc, _) in ends.items() if rc == 0]
    losers = [tag for tag, (rc, _) in ends.items() if rc != 0]
    line = ""
    if len(winners) == 1 and len(losers) == 1:
        held.append("1 completed, 1 refused")
        rc, line = ends[losers[0]]
        _busy_line(rc, line, both[winners[0]].pid, held, failed, "second calibrate")
        (failed if (folder / f"p{losers[0]}.json").exists() else held).append("the refused one wrote no predictor")
    else:
        failed.append(f"{len(winners)} completed, {len(losers)} failed (" + "; ".join(
            f"{t}: {ends[t][1][:80]}" for t in losers) + ")")
    (held if later.returncode == 0 else failed).append(f"a later calibrate exit {later.returncode}")
    try:
        runs = MlflowClient(tracking_uri=f"sqlite:///{folder / 'out' / 'mlflow.db'}").search_runs(
            [e.experiment_id for e in MlflowClient(tracking_uri=f"sqlite:///{folder / 'out' / 'mlflow.db'}")
             .search_experiments()])
        statuses = sorted(r.info.status for r in runs)
        want = len(winners) + (later.returncode == 0)
        (held if statuses == ["FINISHED"] * want else failed).append(
            f"mlflow.db opens: {len(runs)} runs ({'/'.join(sorted(set(statuses)))})")
    except Exception as exc:  # noqa: BLE001 - a broken store is the result being measured
        failed.append(f"mlflow.db does not open ({exc!r:.80})")
    exits = ", ".join(f"{tag} {rc}" for tag, (rc, _) in ends.items()) + f"; later {later.returncode}"
    return {"case": "two `hpo calibrate --from-curves` into one folder at once", "exits": exits, "line": line,
            "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- d. a killed trial worker


def _worker_of(tid: str) -> Optional[int]:
    """The pid of the Ray worker process training trial ``tid``: a ``ray::...Trainable.train`` process
    whose working directory Ray Tune named after the trial (read from ``/proc``: psutil is not a
    dependency of this project; Ray only vendors one)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "ray::" in title and "Trainable.train" in title and os.readlink(proc / "cwd").endswith(tid):
                return int(proc.name)
        except OSError:
            continue
    return None


def _newest_checkpoint(output: Path, tid: str) -> int:
    """The step of the newest complete checkpoint trial ``tid`` has on disk (0: none)."""
    steps = [0]
    for progress in output.glob(f"ray/*/*{tid}/*/progress.json"):
        try:
            steps.append(int(json.loads(progress.read_text())["step"]))
        except (OSError, ValueError, KeyError):
            continue
    return max(steps)


def _reported(output: Path, label: str) -> Optional[dict[str, Any]]:
    """Trial ``label`` ("trial 1"): its id and the last step it reported, from the MLflow store the
    driver logs every result into (the scheduler's snapshot is written only every few seconds)."""
    import sqlite3

    index = int(label.split()[-1])
    query = ("SELECT t.value, MAX(m.step), COUNT(m.step) FROM metrics m JOIN tags t ON t.run_uuid = m.run_uuid "
             "WHERE t.key = 'trial_id' AND substr(t.value, -6) = ? AND m.key = 'loss' GROUP BY t.value")
    try:
        with sqlite3.connect(f"file:{output / 'mlflow.db'}?mode=ro", uri=True, timeout=1) as db:
            row = db.execute(query, (f"_{index:05d}",)).fetchone()
    except sqlite3.Error:
        return None
    return {"tid": row[0], "step": int(row[1]), "points": int(row[2])} if row else None


def _worker_point(point: str, output: Path, label: str, min_step: int) -> Callable[[], Optional[dict[str, Any]]]:
    """A probe for ``point``: once the trial has reported step ``min_step`` (before the first rung, or
    after the early answer), its last report and the worker process training it."""
    def probe() -> Optional[dict[str, Any]]:
        answered = (output / "predicted_best.json").exists()
        if answered != (point == "after the early answer"):
            return None
        if not answered and any(r["decided"] for r in rel._state(output).get("rungs") or []):
            raise RuntimeError("the first rung was decided before the trial's worker was found")
        last = _reported(output, label)
        worker = _worker_of(last["tid"]) if last and last["step"] >= min_step else None
        return {**last, "worker": worker} if worker is not None else None
    return probe


def kill_trial_worker(folder: Path, code: rel.Code, ref: dict[str, Any], ref_answer: str, point: str) -> dict:
    """SIGKILL the worker training the uninterrupted run's predicted best at ``point``; the sweep goes on."""
    config, output, began, driver = _start_sweep(folder, code)
    held: list[str] = []
    failed: list[str] = []
    from trainers.config import TrainConfig, run_controls

    trainer = yaml.safe_load(config.read_text())["trainer"]
    total = run_controls(TrainConfig.model_validate({**trainer, "lr": 0.01})).total_steps
    min_step = 2 * trainer["log_every"] if point == "before the first rung" else total // 2
    worker, at_kill, tid = None, {}, ""
    try:
        at_kill = _wait(driver, _worker_point(point, output, ref_answer, min_step), point)
        worker, tid = at_kill["worker"], at_kill["tid"]
        os.kill(worker, signal.SIGKILL)
        at_kill.update(_reported(output, ref_answer) or {}, checkpoint=_newest_checkpoint(output, tid))
        rc, tail = _finish(driver)
    finally:
        _stop(driver)
    state = rel._state(output).get("trials", {}).get(tid, {})
    (held if worker is not None else failed).append(
        f"killed pid {worker} ({ref_answer} at step {at_kill['step']} of {total})" if worker else "no worker")
    (held if rc == 0 else failed).append(f"sweep exit {rc}" + ("" if rc == 0 else f": {tail[:100]}"))
    errored = any(output.glob(f"ray/*/*{tid}/error.txt"))
    status = state.get("status")
    (held if errored and status == "completed" else failed).append(
        f"{ref_answer} {'errored, retried' if errored else 'no error recorded'} (max_failures 1), ended {status}")
    lost = -(-(at_kill["step"] - at_kill["checkpoint"]) // trainer["log_every"])
    # At most the intervals since the newest checkpoint, and the one in flight when the worker died.
    _same_sweep(ref, output, held, failed, (lost + 1, f"lost at the kill: {lost} intervals since the checkpoint "
                                                      f"at step {at_kill['checkpoint']}"))
    answer_file = output / "predicted_best.json"
    answer = json.loads(answer_file.read_text()) if answer_file.exists() else {}
    named = _label(answer.get("trial_id"))
    revised = answer.get("revised")
    (held if named == ref_answer else failed).append(
        f"early answer {named}" + (f" (revised: {revised.get('why', revised)})" if revised else ""))
    return {"case": f"SIGKILL of the trial worker of {ref_answer}, {point}", "exits": f"sweep {rc}", "line": "",
            "held": held, "failed": failed, "seconds": time.perf_counter() - began}


# ----------------------------------------------------------------------------- the section


def run_section(work: Path, code: rel.Code, ref: dict[str, Any], ref_answer: str) -> list[dict[str, Any]]:
    """The five cases, one after the other (each starts its own local Ray)."""
    cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("resume while the driver runs", lambda: resume_while_running(work / "resume-while-running", code, ref)),
        ("two sweeps into one folder", lambda: two_sweeps(work / "two-sweeps", code, ref)),
        ("two calibrations into one folder", lambda: two_calibrations(work / "two-calibrations", code)),
        *[(f"trial worker killed {p}", lambda p=p, i=i: kill_trial_worker(work / f"worker-kill-{i}", code, ref,
                                                                          ref_answer, p))
          for i, p in enumerate(WORKER_POINTS)]]
    results = []
    for name, case in cases:
        began = time.perf_counter()
        try:
            results.append({"code": code.label, **case()})
        except Exception as exc:  # noqa: BLE001 - a case that cannot run is a row that says so
            results.append({"code": code.label, "case": name, "exits": "n/a", "line": "", "held": [],
                            "failed": [f"did not run: {exc!r:.160}"],
                            "seconds": time.perf_counter() - began})
        print(f"  {results[-1]['case']}: {'holds' if not results[-1]['failed'] else 'FAILS'} "
              f"({results[-1]['seconds']:.0f} s)", flush=True)
    return results


def section(results: list[dict[str, Any]], ref: dict[str, Any], ref_answer: str, note: str = "") -> list[str]:
    """This section of the report as markdown lines."""
    holds = sum(not r["failed"] for r in results)
    out = [SECTION, "", *([note, ""] if note else []),
           "One driver per output folder (an exclusive lock on `<folder>/.hpo.lock`, held by `hpo sweep`, "
           "`hpo resume` and `hpo calibrate`), and a trial whose Ray worker dies. Real processes: the tiny "
           "sweep of the driver-kill section above, compared with its uninterrupted run by the same helpers "
           "(trial outcomes, rung survivors, MLflow runs, compute with work trained twice counted twice); "
           "the calibrations fit the "
           "example curves of the tests (`configs/curves/example_curves.csv`). The worker killed is the one "
           "training the trial the uninterrupted run's early answer names, found by its process title "
           "(`ray::…Trainable.train`) and its working directory (Ray Tune names it after the trial), once the "
           "trial's results are in the MLflow store: before the first rung, and half-way through its training "
           "after the early answer. Sweeps run with Ray Tune's `max_failures=1`, so the trial is retried from "
           "its newest complete checkpoint on disk; work trained twice holds if it is at most the intervals "
           "it had reported since that checkpoint when it was killed, plus the one in flight.", "",
           f"Uninterrupted reference: survivors {rel._rungs(ref['decisions'])}, compute "
           f"{100 * ref['compute']:.1f}%, early answer {ref_answer}, {ref['wall_s']:.0f} s. "
           f"**{holds} of {len(results)} cases hold.**", ""]
    rows = [[r["code"], r["case"], r["exits"], r["line"][:200] or "–", "; ".join(r["held"]) or "–",
             "; ".join(r["failed"]) or "nothing", f"{r['seconds']:.0f}"] for r in results]
    out += [markdown_table(["code", "case", "exits", "message of the refused one", "held", "did not hold", "s"],
                           rows), ""]
    return out


def answer_of(output: Path) -> str:
    """The trial the early answer of a finished sweep folder names ("trial 1")."""
    return _label(json.loads((output / "predicted_best.json").read_text())["trial_id"])


def replace_section(text: str, lines: list[str], title: str = SECTION) -> str:
    """``text`` with the section ``title`` (this one) replaced by ``lines`` (or put before the
    bad-input section)."""
    body = "\n".join(lines)
    if title in text:
        head, rest = text.split(title, 1)
        tail = rest[rest.index("\n## "):].lstrip("\n") if "\n## " in rest else ""
        return head + body + "\n" + tail
    if "## Bad input" in text:
        head, tail = text.split("## Bad input", 1)
        return head + body + "\n## Bad input" + tail
    return text.rstrip("\n") + "\n\n" + body + "\n"


def refresh(md: Path, work: Path) -> list[dict[str, Any]]:
    """``--only-concurrency``: rerun this section and replace it in the existing report."""
    return refresh_section(md, work, run_section, section, flag="--only-concurrency", title=SECTION,
                           json_name="concurrency.json")


def refresh_section(md: Path, work: Path, run: Any, render: Any, *, flag: str, title: str,
                    json_name: str) -> list[dict[str, Any]]:
    """Rerun one section of the report against its own uninterrupted sweep (``run(work, code, ref,
    answer)`` gives its rows, ``render(rows, ref, answer, note)`` its lines) and replace it in ``md``;
    the rows and reference go to ``work/json_name``."""
    began = time.perf_counter()
    code = rel.Code("this branch", rel.REPO_ROOT)
    print("uninterrupted sweep ...", flush=True)
    ref = rel.uninterrupted(work / "uninterrupted", code)
    ref_answer = answer_of(work / "uninterrupted" / "out")
    results = run(work, code, ref, ref_answer)
    minutes = (time.perf_counter() - began) / 60
    note = (f"Regenerated alone with `python benchmarks/reliability.py {flag}` on {time.strftime('%Y-%m-%d')} "
            f"({minutes:.0f} min including its own uninterrupted run; the other sections are from their last runs).")
    md.write_text(replace_section(md.read_text(), render(results, ref, ref_answer, note), title=title))
    (work / json_name).write_text(json.dumps({"reference": ref, "answer": ref_answer, "cases": results},
                                             indent=1, default=str))
    return results
