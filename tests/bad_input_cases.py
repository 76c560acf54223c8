"""The bad-input table: each case is a real `hpo` command on bad input that must exit 2 with
one line naming the field, file or value, having written nothing.

Shared by ``tests/test_bad_input.py`` (one test per case) and ``benchmarks/reliability.py``
(the table in ``benchmarks/reliability.md``). Each case runs ``python -m hpo.service.cli`` in a
subprocess, in a folder of its own that holds only the case's input files.
"""

from __future__ import annotations

import copy
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
        "name": "bad-input", "output_dir": "out", "trainer": copy.deepcopy(TINY_TRAINER),
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


def _read_only(path: Path) -> None:
    """Make ``path`` unwritable for this process: ``chattr +i`` as root (root ignores
    permission bits), else ``chmod`` (a read-only mount reads the same to ``os.access``)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o555 if path.is_dir() else 0o444)


def _writable_again(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    else:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _read_only_dir(name: str, then: Callable[[Path], None] = lambda d: None) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        (d / name).mkdir()
        then(d)
        _read_only(d / name)
    return make


def _example_curves(d: Path, edit: Callable[[list[dict[str, str]]], None] = lambda rows: None,
                    name: str = "curves.csv") -> None:
    import csv

    with open(REPO / "configs/curves/example_curves.csv") as handle:
        rows = list(csv.DictReader(handle))
    edit(rows)
    if name.endswith(".parquet"):
        import pandas as pd

        import io

        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        buffer.seek(0)
        pd.read_csv(buffer).to_parquet(d / name)  # typed columns, as a user's parquet has
        return
    with open(d / name, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _swap_tokens(rows: list[dict[str, str]]) -> None:
    rows[2]["tokens"], rows[3]["tokens"] = rows[3]["tokens"], rows[2]["tokens"]  # one run, out of order


def _tiny_loss(rows: list[dict[str, str]]) -> None:
    rows[10]["loss"] = "1e-300"


def _with_text(extra: str) -> Callable[[Path], None]:
    """The valid sweep with ``extra`` YAML appended (an unknown top-level key: refused later
    anyway, so only the YAML reader's own check can answer before it)."""
    return _text("s.yaml", yaml.safe_dump(sweep_config()) + extra)


#: A "billion laughs" YAML: 9 levels of 9 aliases, 387 million values once expanded, 1 KB on disk.
BILLION_LAUGHS = "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
DEEP_LIST = "[" * 1000 + "]" * 1000
DEEP_KEYS = "{" + "a: {" * 999 + "}" * 1000
DEEP_BLOCK_KEYS = "deep:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(1000)) + "  " * 1001 + "v: 1\n"


def _resumable_with_binary_state(d: Path) -> None:
    """A sweep folder `hpo resume` would continue (sweep.yaml, Ray's experiment state, the
    predictor copy) whose scheduler_state.json is binary."""
    _only_sweep_yaml(d)
    experiment = d / "old" / "ray" / "bad-input"
    experiment.mkdir(parents=True)
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    (d / "old" / "predictor.json").write_bytes((REPO / "hpo/data/predictors/default.json").read_bytes())
    (d / "old" / "scheduler_state.json").write_bytes(bytes(range(256)) * 4)


def _resumable_with_another_rule_knob(d: Path) -> None:
    """A sweep folder `hpo resume` would continue whose decisions were made with the collapse
    rule at margin_z 0.5, and whose sweep.yaml now says margin_z 1.0."""
    from hpo.decisions.scheduler_state import RungRecord, SchedulerState

    _resumable_with_binary_state(d)
    config = yaml.safe_load((d / "old" / "sweep.yaml").read_text())
    rungs = config.get("scheduler", {}).get("rungs", [0.3])
    config.setdefault("scheduler", {})["rule"] = {"name": "collapse", "margin_z": 1.0}
    (d / "old" / "sweep.yaml").write_text(yaml.safe_dump(config))
    settings = {"rungs": rungs, "decision_mode": "sync", "metric": "loss",
                "rule": {"name": "collapse", "margin_z": 0.5, "read_sweep": True}}
    SchedulerState(settings=settings, experiment_id="e", rungs=[RungRecord(i, f) for i, f in enumerate(rungs)]).save(
        d / "old" / "scheduler_state.json")


def _resumable_with_foreign_state(d: Path) -> None:
    """As :func:`_resumable_with_binary_state`, with a state file of another layout under version 2."""
    _resumable_with_binary_state(d)
    (d / "old" / "scheduler_state.json").write_text('{"version": 2, "checkpoints": [], "searcher": {}}')


def _resumable_with_state(d: Path) -> None:
    """As :func:`_resumable_with_binary_state`, with an empty (valid) scheduler state."""
    _resumable_with_binary_state(d)
    (d / "old" / "scheduler_state.json").write_text('{"version": 2, "trials": {}, "rungs": []}')


def _duplicate_key_predictor(d: Path) -> None:
    text = (REPO / "hpo/data/predictors/default.json").read_text()
    (d / "p.json").write_text(text.replace('"schema_version": 4,', '"schema_version": 4,\n  "schema_version": 4,', 1))
    _yaml(sweep_config(predictor="p.json"))(d)


def _predictor_param(name: str, value: float) -> Callable[[Path], None]:
    """The shipped predictor with ``params.<name>`` set to ``value``, as the sweep's predictor."""
    def make(d: Path) -> None:
        import json

        document = json.loads((REPO / "hpo/data/predictors/default.json").read_text())
        document["params"][name] = value
        (d / "p.json").write_text(json.dumps(document))
        _yaml(sweep_config(predictor="p.json"))(d)
    return make


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
    teardown: Callable[[Path], None] = lambda d: None  # undo what stops the folder being deleted


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
    Case("curve_file_too_big", "a 2 GB curve file (above the 4 GB memory budget once read)",
         ["calibrate", "--from-curves", "big.csv", "--output-dir", "out", "--predictor-out", "p.json"],
         _sparse_file("big.csv", 2 * 2**30), ("big.csv", "needs about", "memory budget", "HPO_MEMORY_MB")),
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
    # Round three: each was a traceback, a hang or a bad value accepted and run.
    Case("predictor_out_is_directory", "`--predictor-out` naming a directory",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "pdir"],
         lambda d: (_example_curves(d), (d / "pdir").mkdir()), ("--predictor-out", "pdir", "is a directory")),
    Case("predictor_out_under_file", "`--predictor-out` under a regular file",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "afile/p.json"],
         lambda d: (_example_curves(d), (d / "afile").write_text("x")), ("--predictor-out", "afile", "is a file")),
    Case("report_dir_is_file", "the report directory (`--output-dir`) is a file",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "afile", "--predictor-out", "p.json"],
         lambda d: (_example_curves(d), (d / "afile").write_text("x")), ("--output-dir", "not a directory")),
    Case("report_dir_not_writable", "the report directory is not writable",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "ro", "--predictor-out", "p.json"],
         _read_only_dir("ro", _example_curves), ("--output-dir", "not writable"), teardown=lambda d: _writable_again(d / "ro")),
    Case("output_dir_not_writable", "the sweep's output directory is not writable", ["sweep", "s.yaml"],
         _read_only_dir("ro", _yaml(sweep_config(output_dir="ro"))), ("output_dir", "not writable"),
         teardown=lambda d: _writable_again(d / "ro")),
    Case("sqlite_read_only_directory", "an SQLite tracking store in a read-only directory", ["sweep", "s.yaml"],
         lambda d: _read_only_dir("ro", _yaml(sweep_config(**{"mlflow.tracking_uri": f"sqlite:///{d / 'ro' / 'm.db'}"})))(d),
         ("mlflow.tracking_uri", "not writable"), teardown=lambda d: _writable_again(d / "ro")),
    Case("sqlite_read_only_database", "a read-only SQLite database file as the tracking store", ["sweep", "s.yaml"],
         lambda d: ((d / "m.db").write_bytes(b""), _read_only(d / "m.db"),
                    _yaml(sweep_config(**{"mlflow.tracking_uri": f"sqlite:///{d / 'm.db'}"}))(d)),
         ("mlflow.tracking_uri", "read-only"), teardown=lambda d: _writable_again(d / "m.db")),
    Case("postgres_without_driver", "a Postgres tracking URI without its driver installed", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.tracking_uri": f"postgresql://alice:{SECRET}@127.0.0.1:9/mlflow"})),
         ("mlflow.tracking_uri", "not installed", "pip install"), (SECRET, "alice")),
    Case("experiment_name_too_long", "an MLflow experiment name of 501 characters", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"mlflow.experiment": "x" * 501})), ("mlflow.experiment", "500")),
    Case("yaml_recursive_alias", "a YAML file with a recursive alias", ["sweep", "s.yaml"],
         _with_text("loop: &loop [*loop]\n"), ("s.yaml", "recursive alias")),
    Case("yaml_deep_list", "a YAML file with a 1,000-deep nested list", ["sweep", "s.yaml"],
         _with_text(f"deep: {DEEP_LIST}\n"), ("s.yaml", "nested deeper")),
    Case("yaml_deep_keys", "a YAML file with keys nested 1,000 deep", ["sweep", "s.yaml"],
         _with_text(DEEP_BLOCK_KEYS), ("s.yaml", "nested deeper")),
    Case("yaml_billion_laughs", "a YAML alias bomb (\"billion laughs\", 9 levels)", ["sweep", "s.yaml"],
         _with_text(BILLION_LAUGHS), ("s.yaml", "aliases are expanded")),
    Case("set_recursive_alias", "a `--set` value with a recursive alias",
         ["sweep", "s.yaml", "--set", "trainer.tau=&a [*a]"], _yaml(sweep_config()), ("--set trainer.tau", "recursive")),
    Case("set_deep_list", "a `--set` value nesting lists 1,000 deep",
         ["sweep", "s.yaml", "--set", f"trainer.tau={DEEP_LIST}"], _yaml(sweep_config()), ("--set trainer.tau", "nested deeper")),
    Case("set_deep_keys", "a `--set` value nesting keys 1,000 deep",
         ["sweep", "s.yaml", "--set", f"trainer.tau={DEEP_KEYS}"], _yaml(sweep_config()), ("--set trainer.tau", "nested deeper")),
    Case("resume_binary_state", "`hpo resume` on a folder whose scheduler state file is binary", ["resume", "old"],
         _resumable_with_binary_state, ("scheduler_state.json", "binary")),
    Case("resume_other_rule_knob", "`hpo resume` with a rule knob other than the one its decisions were made with",
         ["resume", "old"], _resumable_with_another_rule_knob, ("scheduler.rule", "margin_z=1", "margin_z=0.5")),
    Case("curve_file_fifo", "a curve file that is a FIFO", ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "p.json"],
         lambda d: os.mkfifo(d / "curves.csv"), ("curves.csv", "FIFO")),
    Case("empty_search_space", "an empty search space (`search_space: {}`)", ["sweep", "s.yaml"],
         _yaml(sweep_config(search_space={})), ("search_space", "empty")),
    Case("predictor_duplicate_key", "a predictor JSON with a duplicated key", ["sweep", "s.yaml"],
         _duplicate_key_predictor, ("p.json", "duplicate key 'schema_version'")),
    Case("parquet_tokens_decrease", "a parquet curve file whose tokens decrease within a run",
         ["calibrate", "--from-curves", "curves.parquet", "--output-dir", "out", "--predictor-out", "p.json"],
         lambda d: _example_curves(d, _swap_tokens, "curves.parquet"), ("curves.parquet", "'tokens' decreases")),
    Case("output_dir_dangling_symlink", "`output_dir` a dangling symbolic link", ["sweep", "s.yaml"],
         lambda d: ((d / "out").symlink_to(d / "elsewhere"), _yaml(sweep_config(output_dir="out"))(d)),
         ("output_dir", "symbolic link", "elsewhere")),
    Case("tau_true", "`trainer.tau: true`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.tau": True})), ("tau", "boolean")),
    Case("output_dir_empty", "`output_dir: \"\"`", ["sweep", "s.yaml"],
         _yaml(sweep_config(output_dir="")), ("output_dir", "empty")),
    Case("curve_loss_1e-300", "one loss point of 1e-300 in `--from-curves`", ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "p.json"],
         lambda d: _example_curves(d, _tiny_loss), ("curves.csv", "'loss'", "1e-300", "at least")),
    # The metric the scheduler decides on.
    Case("metric_unknown", "`scheduler.metric: accuracy`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"scheduler.metric": "accuracy"})), ("scheduler.metric", "val_loss", "accuracy")),
    Case("val_loss_sparse_eval", "`scheduler.metric: val_loss` with `eval_every` above `log_every`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"scheduler.metric": "val_loss"})), ("val_loss", "trainer.eval_every", "log_every (5)")),
    Case("val_loss_with_train_loss_predictor", "`scheduler.metric: val_loss` with the shipped (train-loss) predictor",
         ["sweep", "s.yaml"], _yaml(sweep_config(**{"scheduler.metric": "val_loss", "trainer.eval_every": 5})),
         ("predictor", "fitted on loss", "scheduler.metric is val_loss")),
    # Round four: resources and values that make no sense, checked before Ray starts.
    Case("batch_2e30_one_step", "`search_space: {batch_size: {grid: [1073741824]}}` (one step for the tiny model)",
         ["sweep", "s.yaml"], _yaml(sweep_config(**{"search_space.batch_size": {"grid": [2**30]}})),
         ("tokens_per_param", "1 optimizer step", "limits.min_steps")),
    Case("batch_2e30_memory", "a batch of 2^30 tokens trained long enough (`limits.min_steps: 1`)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search_space.batch_size": {"grid": [2**30]}, "limits.min_steps": 1})),
         ("trainer.batch_size", "1,073,741,824", "needs about", "MB", "share of this machine")),
    Case("trial_memory_mb_too_small", "`resources.memory_mb: 100` (below the tiny trial's estimate)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"resources.memory_mb": 100})), ("needs about", "resources.memory_mb 100 MB")),
    Case("train_batch_2e30", "`hpo train` with `batch_size: 1073741824`", ["train", "--config", "t.yaml", "--output", "out"],
         _text("t.yaml", yaml.safe_dump({**TINY_TRAINER, "lr": 0.01, "batch_size": 2**30})),
         ("t.yaml", "batch_size", "1,073,741,824", "needs about", "this machine")),
    Case("tokens_per_param_tiny", "`trainer.tokens_per_param: 1e-6` (one step)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.tokens_per_param": 1e-6})), ("tokens_per_param", "1e-06", "limits.min_steps")),
    Case("grid_duplicate_values", "duplicate grid values (`lr: {grid: [0.01, 0.01]}`)", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"search_space.lr": {"grid": [0.01, 0.01]}})), ("search_space.lr", "0.01", "more than once")),
    Case("predictor_m_1e300", "a predictor file with `m: 1e300`", ["sweep", "s.yaml"],
         _predictor_param("m", 1e300), ("p.json", "params.m", "1e+300", "recalibrate")),
    Case("predictor_b_const_1e308", "a predictor file with `b_const: 1e308`", ["sweep", "s.yaml"],
         _predictor_param("b_const", 1e308), ("p.json", "params.b_const", "1e+308")),
    Case("curve_file_proc_symlink", "a curve file that is a symlink to `/proc/self/mem`",
         ["calibrate", "--from-curves", "curves.csv", "--output-dir", "out", "--predictor-out", "p.json"],
         lambda d: (d / "curves.csv").symlink_to("/proc/self/mem"), ("curves.csv", "/proc")),
    Case("resume_foreign_state", "`hpo resume` on a state file of another layout (version 2, other keys)",
         ["resume", "old"], _resumable_with_foreign_state,
         ("scheduler_state.json", "version 2", "not its layout", "checkpoints")),
    Case("own_store_not_a_database", "`out/mlflow.db` is not a database (a new sweep into out/)", ["sweep", "s.yaml"],
         lambda d: ((d / "out").mkdir(), (d / "out" / "mlflow.db").write_bytes(b"not a database\n" * 100),
                    _yaml(sweep_config())(d)), ("mlflow.db", "not a usable SQLite database")),
    Case("set_key_1000_parts", "`--set` with a 1,000-part dotted key",
         ["sweep", "s.yaml", "--set", ".".join(["a"] * 1000) + "=1"], _yaml(sweep_config()),
         ("--set a.a.a", "1,000 dotted parts", "nested deeper")),
    Case("report_folder_is_file", "`hpo report DIR` where `DIR/report` is a file", ["report", "old"],
         lambda d: (_resumable_with_state(d), (d / "old" / "report").write_text("x")), ("report", "not a directory")),
    Case("report_sweep_folder_read_only", "`hpo report DIR` where `DIR` is immutable", ["report", "old"],
         lambda d: (_resumable_with_state(d), _read_only(d / "old")), ("report", "not writable"),
         teardown=lambda d: _writable_again(d / "old")),
    Case("calibration_bank_etc_passwd", "calibration `bank: /etc/passwd`", ["calibrate", "c.yaml", "--fit-only"],
         _text("c.yaml", "name: x\nbank: /etc/passwd\n"), ("bank", "/etc/passwd", "not a parquet curve bank")),
    Case("corpus_system_folder", "`trainer.data.corpus: /etc`", ["sweep", "s.yaml"],
         _yaml(sweep_config(**{"trainer.data.corpus": "/etc"})), ("data.corpus", "/etc", "system folder")),
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
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        finally:
            case.teardown(folder)
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
