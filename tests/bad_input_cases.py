"""The bad-input table: each case is a real `hpo` command on bad input that must exit 2 with
one line naming the field, file or value, having written nothing.

Shared by ``tests/test_bad_input.py`` (one test per case) and ``benchmarks/reliability.py``
(the table in ``benchmarks/reliability.md``). Each case runs ``python -m hpo.service.cli`` in a
subprocess, in a folder of its own that holds only the case's input files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_fixtures import TINY_TRAINER  # noqa: E402

#: A password put into a tracking URI: it must appear in no output.
SECRET = "s3cr3t-pw"


def sweep_config(**changes: Any) -> dict[str, Any]:
    """A valid one-trial sweep into ./out, with ``changes`` merged in (dotted keys allowed)."""
    config: dict[str, Any] = {
        "name": "bad-input", "output_dir": "out", "trainer": dict(TINY_TRAINER),
        "search_space": {"lr": {"grid": [0.01]}}, "mlflow": {"experiment": "bad-input"},
    }
    for key, value in changes.items():
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config


def _yaml(data: dict[str, Any]) -> Callable[[Path], None]:
    return lambda d: (d / "s.yaml").write_text(yaml.safe_dump(data))


def _text(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def _big_loss_curves(d: Path) -> None:
    import csv

    with open(REPO / "configs/curves/example_curves.csv") as handle:
        rows = list(csv.DictReader(handle))
    rows[10]["loss"] = "1e308"
    with open(d / "curves.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _only_sweep_yaml(d: Path) -> None:
    (d / "old").mkdir()
    config = sweep_config(output_dir=str(d / "old"))
    (d / "old" / "sweep.yaml").write_text(yaml.safe_dump(config))


def _sparse_file(name: str, size: int) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        with open(d / name, "wb") as handle:
            handle.truncate(size)  # sparse: the size without the disk
    return make


def _other_database(d: Path) -> None:
    import sqlite3

    with sqlite3.connect(d / "other.db") as db:
        db.execute("CREATE TABLE notes (text TEXT)")


@dataclass(frozen=True)
class Case:
    """One bad input: the ``hpo`` arguments, how to create its input files, and the words the
    one error line must contain (and must not)."""

    name: str
    what: str  # the input, as the issue states it
    argv: list[str]
    setup: Callable[[Path], None] = lambda d: None
    expect: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()


CASES: list[Case] = [
    Case("empty_grid", "`lr: {grid: []}`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search_space.lr": {"grid": []}})), ("search_space.lr", "at least one value")),
    Case("yaml_is_directory", "a directory given as YAML", ["sweep", "cfg"],
         lambda d: (d / "cfg").mkdir(), ("cfg", "directory")),
    Case("yaml_is_binary", "a binary file given as YAML", ["sweep", "s.yaml"],
         lambda d: (d / "s.yaml").write_bytes(bytes(range(256)) * 4), ("s.yaml", "binary")),
    Case("predictor_is_directory", "a directory given as the predictor", ["sweep", "s.yaml"],
         lambda d: ((d / "pdir").mkdir(), _yaml(sweep_config(predictor="pdir"))(d)), ("predictor", "directory")),
    Case("lr_inf", "`trainer.lr: .inf`", ["sweep", "s.yaml"],
         _text("s.yaml", yaml.safe_dump(sweep_config()).replace("tau: 0.3", "tau: 0.3\n  lr: .inf")),
         ("trainer.lr", "finite")),
    Case("lr_inf_in_grid", "`lr: {grid: [.inf]}`", ["sweep", "s.yaml"],
         _text("s.yaml", yaml.safe_dump(sweep_config()).replace("- 0.01", "- .inf")),
         ("search_space.lr.grid[0]", "finite")),
    Case("tau_inf", "`trainer.tau: .inf`", ["sweep", "s.yaml"],
         _text("s.yaml", yaml.safe_dump(sweep_config()).replace("tau: 0.3", "tau: .inf")), ("trainer.tau", "finite")),
    Case("duplicate_key", "a duplicate YAML key", ["sweep", "s.yaml"],
         _text("s.yaml", yaml.safe_dump(sweep_config()).replace("tau: 0.3", "tau: 0.3\n  tau: 0.6")),
         ("duplicate key 'tau'", "s.yaml")),
    Case("seed_fraction", "`trainer.seed: 0.5`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.seed": 0.5})), ("seed", "integer")),
    Case("seed_fraction_in_grid", "`seed: {grid: [0.5]}`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search_space.seed": {"grid": [0.5]}})), ("seed", "whole numbers")),
    Case("curve_loss_1e308", "one loss point of 1e308 in `--from-curves`",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "p.json"],
         _big_loss_curves, ("curves.csv", "'loss'", "1e+308")),
    Case("tracking_bogus", "tracking URI `bogus://`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "bogus://x"})), ("mlflow.tracking_uri", "bogus://")),
    Case("tracking_unreachable", "tracking URI `http://127.0.0.1:9`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "http://127.0.0.1:9"})),
         ("mlflow.tracking_uri", "unreachable")),
    Case("tracking_password", "a tracking URI with a password (unreachable)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": f"http://alice:{SECRET}@127.0.0.1:9"})),
         ("http://127.0.0.1:9", "unreachable"), (SECRET, "alice")),
    Case("sqlite_missing_directory", "a `sqlite:` URI into a missing directory", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "sqlite:///nodir/sub/m.db"})),
         ("mlflow.tracking_uri", "does not exist")),
    Case("tracking_in_memory", "tracking URI `sqlite:///:memory:`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "sqlite:///:memory:"})), ("mlflow.tracking_uri", "in-memory")),
    Case("tracking_relative_sqlite", "a relative custom SQLite tracking URI", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "sqlite:///m.db"})), ("mlflow.tracking_uri", "relative")),
    Case("tracking_file_uri", "a `file://` tracking store (MLflow 3 refuses it once used)", ["sweep", "s.yaml"],
         lambda d: _yaml(sweep_config(**{"mlflow.tracking_uri": (d / "store").as_uri()}))(d),
         ("mlflow.tracking_uri", "file stores")),
    Case("tracking_plain_directory", "a plain-directory tracking store", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": "store"})), ("mlflow.tracking_uri", "file stores")),
    Case("from_mlflow_not_mlflow_db", "`--from-mlflow` on an SQLite file that is not an MLflow store",
         ["calibrate", "--from-mlflow", "1", "--tracking-uri", "sqlite:///other.db"], _other_database,
         ("--tracking-uri", "not an MLflow store")),
    Case("tau_inf_string", "`trainer.tau: \"inf\"` (a string)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.tau": "inf"})), ("trainer.tau", "'inf'", "finite")),
    Case("num_samples_huge", "`num_samples: 1e9`", ["sweep", "s.yaml"],
         _yaml(sweep_config(num_samples=1_000_000_000)), ("num_samples", "limits.max_trials")),
    Case("tokens_per_param_huge", "`trainer.tokens_per_param: 1e12`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.tokens_per_param": 1e12})),
         ("tokens_per_param", "limits.max_tokens_per_param")),
    Case("ray_address_unreachable", "`ray.address: 127.0.0.1:9` (nothing listens)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"ray.address": "127.0.0.1:9"})), ("ray.address", "unreachable")),
    Case("curve_file_too_big", "a 101 MB curve file", ["calibrate", "--from-curves", "big.csv", "--output-dir", "out",
                                                        "--predictor-out", "p.json"],
         _sparse_file("big.csv", 101 * 2**20), ("big.csv", "MB", "HPO_MAX_CURVE_MB")),
    Case("resume_only_sweep_yaml", "`hpo resume` on a directory holding only `sweep.yaml`", ["resume", "old"],
         _only_sweep_yaml, ("nothing to resume",)),
    Case("from_mlflow_no_store", "`--from-mlflow` with a bad id (no store given)", ["calibrate", "--from-mlflow", "42"],
         expect=("--from-mlflow", "--tracking-uri")),
    Case("from_mlflow_missing_db", "`--from-mlflow` on a SQLite file that does not exist",
         ["calibrate", "--from-mlflow", "42", "--tracking-uri", "sqlite:///absent.db"],
         expect=("--tracking-uri", "absent.db")),
    Case("name_traversal", "sweep `name: ../../x`", ["sweep", "s.yaml"],
         _yaml(sweep_config(name="../../x")), ("name", "../../x")),
    Case("calibration_name_traversal", "calibration `name: ../../x`", ["calibrate", "c.yaml", "--fit-only"],
         _text("c.yaml", "name: ../../x\n"), ("name", "../../x")),
    Case("unknown_key", "a misspelt key", ["sweep", "s.yaml"], _yaml(sweep_config(schedular={})), ("schedular",)),
    Case("negative_lr", "`lr: {grid: [-1]}`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search_space.lr": {"grid": [-1.0]}})), ("lr", "greater than 0")),
    Case("rung_out_of_range", "`rungs: [0.1, 1.5]`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"scheduler.rungs": [0.1, 1.5]})), ("scheduler.rungs",)),
    Case("batch_not_divisible", "a batch not divisible by the sequence length", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.batch_size": 1000})), ("batch_size",)),
    Case("missing_predictor", "a missing predictor file", ["sweep", "s.yaml"],
         _yaml(sweep_config(predictor="missing.json")), ("predictor", "missing.json")),
    Case("unknown_packaged_sweep", "`hpo sweep nosuch` (no file, no packaged sweep)", ["sweep", "nosuch"],
         expect=("nosuch", "quickstart")),
    Case("output_dir_is_file", "`output_dir` naming a file", ["sweep", "s.yaml"],
         lambda d: ((d / "afile").write_text("x"), _yaml(sweep_config(output_dir="afile"))(d)),
         ("output_dir", "not a directory")),
    Case("num_cpus_zero", "`ray.num_cpus: 0`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"ray.num_cpus": 0})), ("ray.num_cpus",)),
    Case("search_unknown_algorithm", "`search.algorithm: bayes`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search.algorithm": "bayes"})), ("search.algorithm", "optuna")),
    Case("search_optuna_on_grid", "`search.algorithm: optuna` over a `grid`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search.algorithm": "optuna"})), ("search.algorithm", "lr", "choice")),
    Case("search_startup_without_optuna", "`search.n_startup_trials` with random search", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search.n_startup_trials": 5})), ("n_startup_trials", "optuna")),
    Case("search_max_concurrent_zero", "`search.max_concurrent: 0`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search.max_concurrent": 0})), ("search.max_concurrent",)),
]


@dataclass
class Outcome:
    """What one case did."""

    case: Case
    returncode: int
    stderr: str
    stdout: str
    seconds: float
    written: list[str] = field(default_factory=list)  # paths that appeared in the case folder

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.strip().splitlines() if line.strip()]

    def problems(self) -> list[str]:
        """Why this case fails the contract (empty: it holds)."""
        out = []
        if self.returncode != 2:
            out.append(f"exit status {self.returncode}, not 2")
        if len(self.lines) != 1:
            out.append(f"{len(self.lines)} lines on stderr, not 1")
        text = self.stderr + self.stdout
        out += [f"no {word!r} in the message" for word in self.case.expect if word not in text]
        out += [f"{word!r} shown" for word in self.case.forbid if word in text]
        if self.written:
            out.append(f"wrote {', '.join(self.written)}")
        return out


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def start(case: Case, folder: Path) -> Callable[[], Outcome]:
    """Create the case's files in ``folder`` and start its command; call the result to wait."""
    folder.mkdir(parents=True, exist_ok=True)
    case.setup(folder)
    before = _files(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "hpo.service.cli", *case.argv], cwd=folder, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(timeout: Optional[float] = 120) -> Outcome:
        stdout, stderr = process.communicate(timeout=timeout)
        seconds = time.perf_counter() - began
        written = sorted(_files(folder) - before)
        return Outcome(case, process.returncode, stderr, stdout, seconds, written)

    return wait


def run_all(root: Path, parallel: int = 4) -> dict[str, Outcome]:
    """Run every case (``parallel`` at a time), each in ``root/<case name>``."""
    outcomes: dict[str, Outcome] = {}
    pending = list(CASES)
    running: list[tuple[Case, Callable[[], Outcome]]] = []
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            running.append((case, start(case, root / case.name)))
        case, wait = running.pop(0)
        outcomes[case.name] = wait()
    return outcomes
