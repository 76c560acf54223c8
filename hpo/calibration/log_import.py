"""Training logs as curves: a folder of run exports (W&B runs as JSON) in the curve format.

``hpo calibrate --from-logs DIR``, the public bench (``benchmarks/public_sweeps.py``) and the
monitor read a team's training logs through this one import. Each ``*.json`` file under the
folder (sub-folders included: a folder of re-runs) is one run, as W&B's export writes it:

* ``config``: the run's settings; read are ``lr`` (peak η), ``weight_decay`` (λ, PyTorch-coupled:
  decay per step η·λ), ``batch_size`` × ``acc_steps`` × ``world_size`` × ``sequence_length``
  (tokens a step, B), ``iterations`` (T, optimizer steps), ``n_layer``/``n_embd``/``vocab_size``,
  ``dataset``, ``seed``, ``wandb_project`` (the experiment: sweeps are grouped within one) and
  ``resume_from`` (a checkpoint path ``.../<run>/ckpts/<step>``);
* ``summary``: ``parameters`` (all parameters; N is that less the tied embedding, vocab × d);
* ``history``: ``val`` (``iter``, ``val_loss``) and ``train`` (``iter``, ``train_loss``,
  ``train_lr``: the learning rate in force).

What the import does, and why:

* **Steps logged twice** (a run resumed from a checkpoint re-logs the steps after it): the last
  value logged at a step is kept, so the curve is the trajectory the run went on with.
* **A cooldown resumed from a parent** (``resume_from``): its log starts at the checkpoint; its
  curve is the parent's points before that step followed by its own, no step twice. The parent is
  the run whose file name (or W&B name) is the checkpoint folder's run name, with or without a
  W&B prefix (``ann0.2_<run>``), that is not itself a resumed run and reaches the step.
* **The schedule** is read from the logged learning rate (``Schedule.from_logged``): the named
  schedule that reproduces it, else the logged values themselves; the config's schedule words are
  not trusted (an export may say ``sqrt`` for a run that never decayed).
* **Complete** runs reach the end of training within one logging interval
  (``hpo.calibration.curve_import``): a run evaluated every 200 steps of 25,000 ends at 24,800.

Every failure names the file and the field. Files are bounded before they are parsed (a FIFO or a
device is refused, a file over :data:`MAX_LOG_BYTES` too, and nesting deeper than Python's parser
allows is one message).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from hpo.common.errors import InputError
from hpo.common.paths import PathError, check_input_file
from hpo.calibration.curve_import import ImportedCurves, curves_from_frame
from predictors.schedules import Schedule

#: Largest run export read (the biggest public one is ~0.7 MB; a W&B export with every metric
#: of a long run stays far below it).
MAX_LOG_BYTES = 64 * 1024 * 1024
#: The metrics a curve can be built from, and the history table and key each is in.
METRICS = {"val_loss": ("val", "val_loss"), "train_loss": ("train", "train_loss")}


class LogImportError(InputError):
    """A training log that cannot be read; the message names the file and the field."""


@dataclass(frozen=True)
class LoggedRun:
    """One run export, its steps logged twice resolved (the last value kept).

    ``run_id`` is the file's path under the folder without ``.json`` (``grad_norm/<name>`` for a
    re-run in a sub-folder); ``curve`` holds (steps, metric) and ``lr`` (steps, learning rate).
    """

    run_id: str
    path: Path
    name: str
    config: dict[str, Any]
    summary: dict[str, Any]
    curves: dict[str, tuple[np.ndarray, np.ndarray]]
    lr: tuple[np.ndarray, np.ndarray]

    @property
    def resume(self) -> Optional[tuple[str, int]]:
        """(the parent's run name, the checkpoint step) for a resumed run, else None."""
        path = self.config.get("resume_from")
        if not path:
            return None
        match = re.search(r"([^/]+)/ckpts/(\d+)/?$", str(path))
        if match is None:
            raise LogImportError(f"{self.path}: config.resume_from {path!r} is not '<folder>/<run>/ckpts/<step>'")
        return match.group(1), int(match.group(2))

    @property
    def iterations(self) -> int:
        return int(_number(self, "iterations"))

    @property
    def batch_tokens(self) -> float:
        return float(np.prod([_number(self, k) for k in ("batch_size", "acc_steps", "world_size", "sequence_length")]))


@dataclass
class LogImport:
    """A folder of logs: the long-format frame of ``hpo.calibration.curve_import`` (one row a
    point, a run's parent joined on), its curves, and what was left out and why."""

    frame: pd.DataFrame
    runs: dict[str, LoggedRun]
    imported: ImportedCurves
    notes: list[str] = field(default_factory=list)
    reruns: dict[str, str] = field(default_factory=dict)  # re-run id -> the run it repeats

    @property
    def curves(self) -> list[Any]:
        return self.imported.curves


def _number(run: "LoggedRun", key: str) -> float:
    value = run.config.get(key)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LogImportError(f"{run.path}: config.{key} is {value!r}, not a number") from None
    if not math.isfinite(number) or number < 0:
        raise LogImportError(f"{run.path}: config.{key} is {value!r}; it must be a finite number >= 0")
    return number


def _last_per_step(steps: Any, values: Any, path: Path, table: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps in order, each with the value logged last at it (a resume re-logs steps); points
    with a missing or non-numeric value are dropped."""
    if not isinstance(steps, list) or not isinstance(values, list) or len(steps) != len(values):
        raise LogImportError(f"{path}: history.{table}: 'iter' and its values must be lists of one length")
    latest: dict[int, float] = {}
    for step, value in zip(steps, values):
        try:
            s, v = int(step), float(value)
        except (TypeError, ValueError):
            continue
        latest[s] = v
    order = sorted(latest)
    return np.asarray(order, dtype=np.int64), np.asarray([latest[s] for s in order], dtype=np.float64)


def read_log(path: str | Path, root: Optional[Path] = None) -> LoggedRun:
    """One run export (see the module docstring), bounded and checked before it is parsed."""
    path = Path(path)
    try:
        check_input_file(path, what="training log")
    except PathError as exc:
        raise LogImportError(str(exc)) from None
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise LogImportError(f"{path}: {size / 2**20:.0f} MB is over the {MAX_LOG_BYTES / 2**20:.0f} MB a run export may be")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise LogImportError(f"{path}: JSON nested too deeply to be a run export") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LogImportError(f"{path}: not a JSON run export: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or not isinstance(data.get("history"), dict):
        raise LogImportError(f"{path}: a run export needs the objects 'config' and 'history' (a W&B run as JSON)")
    history = data["history"]
    curves = {}
    for metric, (table, key) in METRICS.items():
        rows = history.get(table)
        if isinstance(rows, dict) and key in rows and "iter" in rows:
            curves[metric] = _last_per_step(rows["iter"], rows[key], path, table)
    train = history.get("train") if isinstance(history.get("train"), dict) else {}
    lr = (_last_per_step(train["iter"], train["train_lr"], path, "train")
          if "iter" in train and "train_lr" in train else (np.zeros(0, np.int64), np.zeros(0)))
    run_id = (path.relative_to(root) if root else Path(path.name)).with_suffix("").as_posix()
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    return LoggedRun(run_id, path, str(data.get("name") or path.stem), data["config"], summary, curves, lr)


def non_embedding_params(run: LoggedRun) -> float:
    """N: the logged parameter count less the (tied) token embedding, vocab × d_model."""
    total = run.summary.get("parameters")
    try:
        total = float(total)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LogImportError(f"{run.path}: summary.parameters is {total!r}; the parameter count is needed for TPP") from None
    n = total - _number(run, "vocab_size") * _number(run, "n_embd")
    if not n > 0:
        raise LogImportError(f"{run.path}: summary.parameters {total:.0f} is not above the embedding's "
                             "vocab_size × n_embd; cannot tell the non-embedding parameters")
    return n


def find_parent(child: LoggedRun, runs: dict[str, LoggedRun], metric: str) -> Optional[LoggedRun]:
    """The run ``child`` was resumed from (module docstring), or None when it is not in the folder.

    Preference: a file named exactly as the checkpoint's run, then one with a W&B prefix, top-level
    files before sub-folders; only runs that were not resumed themselves and that logged ``metric``
    from the start up to the checkpoint step qualify."""
    resume = child.resume
    if resume is None:
        return None
    name, step = resume

    def rank(run: LoggedRun) -> Optional[tuple[int, int, str]]:
        stem = Path(run.run_id).name
        exact = stem == name or run.name == name
        if not (exact or stem.endswith("_" + name)) or run.resume is not None or run is child:
            return None
        steps = run.curves.get(metric, (np.zeros(0),))[0]
        if steps.size < 2 or steps[0] > np.diff(steps).max() or steps[-1] < step - np.diff(steps).max():
            return None
        return (0 if exact else 1, run.run_id.count("/"), run.run_id)

    ranked = sorted((r, run) for run in runs.values() if (r := rank(run)) is not None)
    return ranked[0][1] if ranked else None


def joined_series(child: LoggedRun, parent: Optional[LoggedRun], metric: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, metric, lr steps, lr): the parent's points before the checkpoint step, then the
    child's own; each step once."""
    steps, values = child.curves[metric]
    lr_steps, lr = child.lr
    if parent is not None and child.resume is not None:
        cut = child.resume[1]
        p_steps, p_values = parent.curves[metric]
        before = p_steps < min(cut, steps[0] if steps.size else cut)
        steps, values = np.concatenate([p_steps[before], steps]), np.concatenate([p_values[before], values])
        pl_steps, p_lr = parent.lr
        before = pl_steps < min(cut, lr_steps[0] if lr_steps.size else cut)
        lr_steps, lr = np.concatenate([pl_steps[before], lr_steps]), np.concatenate([p_lr[before], lr])
    return steps, values, lr_steps, lr


def run_schedule(run: LoggedRun, lr_steps: np.ndarray, lr: np.ndarray) -> Schedule:
    """The schedule the logged learning rate shows (``Schedule.from_logged``); without a logged LR,
    a linear warmup of ``config.warmup_steps`` and the config's ``scheduler`` word (cos, wsd,
    const) taken at its face value, which is said in the run's notes by the caller."""
    total = run.iterations
    if lr_steps.size >= 4:
        return Schedule.from_logged(lr_steps / total, lr)
    warmup = _number(run, "warmup_steps") / total if "warmup_steps" in run.config else 0.0
    word = str(run.config.get("scheduler", "")).lower()
    if word.startswith("cos"):
        return Schedule("cosine", warmup)
    if word == "wsd":
        return Schedule("wsd", warmup, float(run.config.get("wsd_fract_decay") or 0.2))
    if word in ("none", "const", "constant"):
        return Schedule("constant", warmup)
    raise LogImportError(f"{run.path}: no logged learning rate (history.train.train_lr) and config.scheduler "
                         f"{run.config.get('scheduler')!r} is not cos, wsd or constant: the schedule is unknown")


def load_log_dir(folder: str | Path, *, metric: str = "val_loss", complete_only: bool = True) -> LogImport:
    """Every run export under ``folder`` as curves (module docstring).

    Example:
        A constant-LR parent and a cooldown resumed from it at step 600 become one curve each;
        the cooldown's curve starts with its parent's points:

        >>> import json, tempfile
        >>> def export(name, lr, steps, resume=None):
        ...     config = {"lr": 1e-3, "weight_decay": 0.1, "batch_size": 8, "acc_steps": 1, "world_size": 1,
        ...               "sequence_length": 128, "iterations": 1000, "n_layer": 2, "n_embd": 64,
        ...               "vocab_size": 100, "dataset": "toy", "seed": 0, "resume_from": resume}
        ...     return {"name": name, "config": config, "summary": {"parameters": 106_400},
        ...             "history": {"val": {"iter": steps, "val_loss": [5 - s / 500 for s in steps]},
        ...                         "train": {"iter": steps, "train_lr": [lr(s) for s in steps]}}}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     folder = Path(tmp)
        ...     _ = (folder / "stable.json").write_text(json.dumps(export(
        ...         "stable", lambda s: 1e-3, list(range(100, 1001, 100)))))
        ...     _ = (folder / "cool.json").write_text(json.dumps(export(
        ...         "cool", lambda s: 1e-3 * min(1, (1000 - s) / 400), list(range(600, 1001, 100)),
        ...         resume="/exps/stable/ckpts/600")))
        ...     logs = load_log_dir(folder)
        >>> [(c.meta["name"], len(c.t_hat), c.controls.schedule.name) for c in logs.curves]
        [('cool', 10, 'wsd'), ('stable', 10, 'constant')]
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise LogImportError(f"--from-logs: {folder} is not a folder of run exports")
    paths = sorted(p for p in folder.rglob("*.json") if not p.name.startswith("."))
    if not paths:
        raise LogImportError(f"--from-logs: no *.json run export under {folder}")
    if metric not in METRICS:
        raise LogImportError(f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    runs = {r.run_id: r for r in (read_log(p, folder) for p in paths)}
    frames, notes = [], []
    for run in runs.values():
        if metric not in run.curves or run.curves[metric][0].size == 0:
            notes.append(f"run {run.run_id}: no {metric} history; left out")
            continue
        parent = find_parent(run, runs, metric)
        if run.resume is not None and parent is None:
            notes.append(f"run {run.run_id}: resumed from {run.resume[0]} at step {run.resume[1]}, which is not "
                         "in the folder; left out (its curve would start mid-training)")
            continue
        frames.append(_run_frame(run, parent, metric))
    if not frames:
        raise LogImportError(f"--from-logs: {folder}: no run with a {metric} history: " + "; ".join(notes))
    frame = pd.concat(frames, ignore_index=True)
    imported = curves_from_frame(frame, source=f"logs:{folder.resolve()}", complete_only=complete_only)
    return LogImport(frame, runs, imported, notes + imported.notes, rerun_pairs(frame["run_id"].unique()))


def rerun_pairs(run_ids: Any) -> dict[str, str]:
    """Re-runs: a run in a sub-folder (``grad_norm/<name>``) whose name is also a top-level run's."""
    ids = {str(r) for r in run_ids}
    return {r: Path(r).name for r in sorted(ids) if "/" in r and Path(r).name in ids}


def load_curve_bench(path: str | Path) -> LogImport:
    """A bench kept as a curve file (the frame :func:`load_log_dir` builds, written as parquet:
    ``hpo/data/curves/public_lr_scheduling.parquet``), with its re-runs told by their run ids."""
    from hpo.calibration.curve_import import load_curves_file

    imported = load_curves_file(path)
    frame = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
    return LogImport(frame, {}, imported, list(imported.notes), rerun_pairs(frame["run_id"].unique()))


def _run_frame(run: LoggedRun, parent: Optional[LoggedRun], metric: str) -> pd.DataFrame:
    steps, values, lr_steps, lr = joined_series(run, parent, metric)
    total_steps = run.iterations
    batch = run.batch_tokens
    n_params = non_embedding_params(run)
    schedule = run_schedule(run, lr_steps, lr)
    tokens = total_steps * batch
    frame = pd.DataFrame({"run_id": run.run_id, "step": steps, "loss": values})
    controls = schedule.to_dict()
    points = controls.pop("points", None)
    frame = frame.assign(
        batch_size=batch, eta=_number(run, "lr"), weight_decay=_number(run, "weight_decay"),
        total_tokens=tokens, n_params=n_params, tokens_per_param=tokens / n_params,
        **{k: v for k, v in controls.items() if k != "name"}, schedule=controls["name"],
        corpus=str(run.config.get("dataset", "")), seed=run.config.get("seed"), run_name=run.name,
        project=str(run.config.get("wandb_project") or ""),
        d_model=run.config.get("n_embd"))
    if points is not None:  # the curve import rebuilds a logged schedule from the LR at each point
        frame["logged_lr"] = np.interp(steps, lr_steps, lr)
    return frame


def rerun_spread(logs: LogImport) -> Optional[dict[str, Any]]:
    """The run-to-run noise of the final: the RMS of the final-loss differences between each re-run
    and the run it repeats (identical settings), with the pairs; None without a re-run."""
    finals = {c.meta["name"]: c.final_loss for c in logs.curves}
    pairs = [(a, b, finals[a] - finals[b]) for a, b in sorted(logs.reruns.items()) if a in finals and b in finals]
    if not pairs:
        return None
    diffs = np.array([d for _, _, d in pairs])
    return {"rms_difference": float(np.sqrt(np.mean(diffs ** 2))), "max_difference": float(np.abs(diffs).max()),
            "pairs": [{"rerun": a, "run": b, "difference": float(d)} for a, b, d in pairs]}


#: Non-embedding N at or below which a run calibrates: the 33M–93M-parameter ladder (N 14M–61M),
#: below the bench's 124M (N 85M).
CALIBRATE_MAX_PARAMS = 70e6


def split(logs: LogImport, calibrate_max_params: float = CALIBRATE_MAX_PARAMS) -> tuple[list[Any], list[Any], str]:
    """A bench of logs split the paper's way (``benchmarks/public_sweeps.py``, ``hpo replay public``):
    (calibration curves, bench curves, the corpus): the bench corpus is the one of the largest
    sweeps' runs; calibration curves are its runs at N ≤ ``calibrate_max_params``, re-runs excluded
    from both (they measure the noise)."""
    reruns = set(logs.reruns)
    curves = [c for c in logs.curves if c.meta["name"] not in reruns]
    big = [c for c in curves if (c.controls.n_params or 0) > calibrate_max_params]
    corpus = max({c.meta.get("corpus") for c in big}, key=lambda k: sum(c.meta.get("corpus") == k for c in big))
    calibration = [c for c in curves if c.meta.get("corpus") == corpus
                   and (c.controls.n_params or math.inf) <= calibrate_max_params]
    return calibration, [c for c in big if c.meta.get("corpus") == corpus], str(corpus)
