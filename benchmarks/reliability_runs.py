"""One real sweep run, killed and compared: the pieces sections 1 and 4 of
``benchmarks/reliability.py`` share (``benchmarks/reliability_concurrency.py`` uses them too; here so
that neither report module imports the other).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

from sweep_fixtures import tiny_sweep  # noqa: E402

KILL_POINTS = ("before any trial ends", "mid-sweep", "right after the first decision")


@dataclass
class Code:
    """A version of the code to run: a label and the folder put first on PYTHONPATH."""

    label: str
    root: Path


def _env(code: Code) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code.root), "RAY_USAGE_STATS_ENABLED": "0"}


def _state(output: Path) -> dict[str, Any]:
    try:
        return json.loads((output / "scheduler_state.json").read_text())
    except (OSError, ValueError):
        return {}


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- 1. kill and resume


def _kill_condition(point: str) -> Callable[[dict[str, Any]], bool]:
    def reached(state: dict[str, Any]) -> bool:
        rungs, trials = state.get("rungs") or [], (state.get("trials") or {}).values()
        if not rungs:
            return False
        if point == "before any trial ends":
            ended = any(t["status"] in ("stopped", "completed", "diverged") for t in trials)
            # The snapshot keeps no curves (they are in scheduler_state.history.jsonl): a trial
            # with reported progress is one that has trained a few steps.
            return not ended and any((t.get("last_train_fraction") or 0) >= 0.03 for t in trials)
        if point == "right after the first decision":
            return bool(rungs[0]["decided"])
        # mid-sweep: the survivors are between the rungs
        alive = [t for t in trials if t["status"] not in ("stopped", "completed", "diverged")]
        return bool(rungs[0]["decided"]) and not rungs[1]["decided"] and any(
            t.get("last_train_fraction", 0) >= 0.3 for t in alive)
    return reached


def _sweep_config(folder: Path, code: Code) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_sweep(folder / "out")
    if code.label != "this branch":  # older code knows no packaged predictor: name the file
        config["predictor"] = str(code.root / "configs" / "predictors" / "default.json")
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _summary(output: Path, tracking_uri: Optional[str] = None, experiment_name: str = "tiny-test") -> dict[str, Any]:
    """Trial outcomes, decisions, MLflow runs and compute of a finished sweep folder (its runs in
    its own SQLite store, or in experiment ``experiment_name`` at ``tracking_uri``)."""
    from mlflow.tracking import MlflowClient

    state = _state(output)

    def trial(tid: str) -> str:  # ids differ per run ("7dfd0_00001"); the index names the config
        return "trial " + tid.rsplit("_", 1)[-1].lstrip("0") if "_" in tid else tid

    outcomes = {trial(tid): (t["status"], t.get("stopped_at")) for tid, t in state.get("trials", {}).items()}
    decisions = [tuple(trial(t) for t in r["survivors"]) if r["decided"] else None for r in state.get("rungs", [])]
    client = MlflowClient(tracking_uri=tracking_uri or f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    logged, repeated = 0, 0
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        logged += len(steps)
        repeated += len(steps) - len(set(steps))
    config = yaml.safe_load((output / "sweep.yaml").read_text())
    from trainers.config import TrainConfig, run_controls

    trainer = TrainConfig.model_validate({**config["trainer"], "lr": 0.01})
    intervals = -(-run_controls(trainer).total_steps // trainer.log_every)
    n_trials = len(outcomes) or 1
    return {
        "outcomes": outcomes, "decisions": decisions,
        "parents": len(parents), "children": len(children),
        "running": sum(r.info.status == "RUNNING" for r in runs),
        "statuses": sorted({r.info.status for r in runs}),
        "compute": logged / (intervals * n_trials), "repeated": repeated,
    }


def uninterrupted(folder: Path, code: Code) -> dict[str, Any]:
    config = _sweep_config(folder, code)
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "hpo.service.cli", "sweep", str(config)], env=_env(code), cwd=folder,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"uninterrupted sweep failed: {run.stderr[-2000:]}")
    return {**_summary(folder / "out"), "wall_s": time.perf_counter() - began}


def kill_and_resume(folder: Path, code: Code, point: str,
                    probe: Optional[Callable[[Path], bool]] = None, poll_s: float = 0.1,
                    sigterms: int = 0) -> dict[str, Any]:
    """Run the sweep, SIGKILL its process group at ``point`` (or once ``probe(output)`` is true,
    polled every ``poll_s``), copy the folder, resume the copy. ``sigterms`` > 0: send that many
    SIGTERMs to the driver alone instead (1 s apart; what kill, timeout, Slurm or Kubernetes send
    first) and let it end by itself (its exit status is in ``stop_rc``), SIGKILL only after 300 s."""
    config = _sweep_config(folder, code)
    output = folder / "out"
    if probe is None:
        reached = _kill_condition(point)
        probe = lambda out: reached(_state(out))  # noqa: E731
    driver = subprocess.Popen([sys.executable, "-m", "hpo.service.cli", "sweep", str(config)], env=_env(code), cwd=folder,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    began = time.perf_counter()
    try:
        while not probe(output):
            if driver.poll() is not None:
                raise RuntimeError(f"the sweep ended before {point!r}")
            if time.perf_counter() - began > 1800:
                raise RuntimeError(f"{point!r} not reached in 30 min")
            time.sleep(poll_s)
        for k in range(sigterms):
            if k:
                time.sleep(1.0)
            os.kill(driver.pid, signal.SIGTERM)
        stop_rc = driver.wait(timeout=300) if sigterms else None
    finally:
        if driver.poll() is None or not sigterms:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        with contextlib.suppress(ProcessLookupError):  # Ray's processes of a driver that ended itself
            os.killpg(driver.pid, signal.SIGKILL)
    at_kill = _state(output)
    killed = {"decided": sum(r["decided"] for r in at_kill.get("rungs", [])),
              "t_max": max(((t.get("last_train_fraction") or 0) for t in at_kill.get("trials", {}).values()), default=0)}
    copy = folder / "moved" / "out"
    shutil.copytree(output, copy)
    original = _digests(output)
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "hpo.service.cli", "resume", str(copy)], env=_env(code), cwd=folder,
                         capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - began
    result = {"point": point, "killed": killed, "resume_rc": run.returncode, "resume_wall_s": wall,
              "stop_rc": stop_rc if sigterms else None,
              "original_untouched": _digests(output) == original,
              "resume_tail": run.stderr.strip().splitlines()[-1:] if run.returncode else []}
    # Where the resumed sweep kept its records: the copy, or (older code) the original it wrote into.
    result["records_in"] = "copy" if result["original_untouched"] else "original"
    try:
        result.update(_summary(copy if result["original_untouched"] else output))
    except Exception as exc:  # noqa: BLE001 - report what broke instead of dying
        result["summary_error"] = repr(exc)
    return result


def _rungs(decisions: list) -> str:
    return "; ".join(f"rung {i + 1}: " + (", ".join(d) if d is not None else "undecided")
                     for i, d in enumerate(decisions))


def _compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, str]:
    if "outcomes" not in got:
        return {k: f"n/a ({got.get('summary_error', 'resume failed')})" for k in ("trials", "decisions", "mlflow",
                                                                                  "compute")}
    diff = [f"{tid}: {got['outcomes'].get(tid, ('missing',))[0]}" for tid in ref["outcomes"]
            if ref["outcomes"][tid] != got["outcomes"].get(tid)]
    trials = "same" if not diff and len(got["outcomes"]) == len(ref["outcomes"]) else f"differ ({'; '.join(diff)})"
    decisions = "same" if got["decisions"] == ref["decisions"] else f"differ: {_rungs(got['decisions'])}"
    mlflow = (f"{got['parents']} parent + {got['children']} trial runs, "
              f"{got['running']} RUNNING ({'/'.join(got['statuses'])})")
    delta = 100 * (got["compute"] - ref["compute"])
    compute = f"{100 * got['compute']:.1f}% ({delta:+.1f} pt; {got['repeated']} intervals trained twice)"
    return {"trials": trials, "decisions": decisions, "mlflow": mlflow, "compute": compute}


# ----------------------------------------------------------------------------- 2. concurrent appends
