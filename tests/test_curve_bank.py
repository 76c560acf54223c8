"""The curve bank: parquet round trip, replace-by-run-id, conversion to predictor curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpo.trials.curve_bank import CurveBankError, append_runs, bank_curves, curve_frame, load_bank, run_id_of


def _run(run_id: str, tau: float, status: str = "completed") -> dict:
    return {"run_id": run_id, "sweep": "test", "tau": tau, "tokens_per_param": 20.0,
            "schedule": "linear", "warmup_fraction": 0.1, "decay_fraction": 0.2,
            "n_params": 1000, "total_tokens": 20000, "batch_size": 100, "eta": 0.01,
            "weight_decay": 0.1, "d_model": 32, "n_layers": 1, "seq_len": 32, "seed": 0,
            "data_seed": 0, "corpus_hash": "abc", "status": status, "config_json": "{}"}


def _points(n: int = 20) -> list[dict]:
    t = np.linspace(0.05, 1.0, n)
    return [{"step": i, "tokens": int(x * 20000), "train_fraction": float(x), "train_loss": 2 / x**0.1,
             "smoothed_loss": 2 / x**0.1, "val_loss": float("nan"), "lr": 0.01} for i, x in enumerate(t)]


def test_run_id_is_stable_and_order_free() -> None:
    # The same config (in any key order) maps to the same run id; another config does not.
    assert run_id_of({"a": 1, "b": {"c": 2}}) == run_id_of({"b": {"c": 2}, "a": 1})
    assert run_id_of({"a": 1}) != run_id_of({"a": 2})
    # Execution-only fields (torch.compile on or off) do not make a new run: banked runs stay found.
    assert run_id_of({"a": 1, "compile": "auto"}) == run_id_of({"a": 1, "compile": False}) == run_id_of({"a": 1})


def test_schedule_floor_and_shape_keep_old_run_ids() -> None:
    # A config with the default floor (0) and cooldown (linear) is the run banked before they
    # existed; another floor or shape is another run.
    old = {"schedule": "wsd", "tau": 0.3}
    assert run_id_of({**old, "final_fraction": 0.0, "decay_shape": "linear"}) == run_id_of(old)
    assert run_id_of({**old, "final_fraction": 0.1}) != run_id_of(old)
    assert run_id_of({**old, "decay_shape": "sqrt"}) != run_id_of(old)


def test_append_and_reload(tmp_path: Path) -> None:
    # Appended runs come back with every column; re-appending a run replaces it, never duplicates.
    path = tmp_path / "bank.parquet"
    assert append_runs(path, [curve_frame(_run("r1", 0.1), _points()), curve_frame(_run("r2", 0.2), _points())]) == 40
    append_runs(path, [curve_frame(_run("r1", 0.1), _points(10))])
    frame = load_bank(path)
    assert sorted(frame["run_id"].unique()) == ["r1", "r2"]
    assert (frame["run_id"] == "r1").sum() == 10


def test_bank_curves_skip_diverged(tmp_path: Path) -> None:
    # Only completed runs become fit curves, each with its controls.
    path = tmp_path / "bank.parquet"
    append_runs(path, [curve_frame(_run("ok", 0.1), _points()),
                       curve_frame(_run("bad", 0.1, status="diverged"), _points())])
    curves = bank_curves(load_bank(path))
    assert [c.meta["name"] for c in curves] == ["ok"]
    assert curves[0].controls.tau == pytest.approx(0.1)


def test_missing_columns_named(tmp_path: Path) -> None:
    # A parquet file without the bank's columns is refused with a message naming the file.
    path = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(path)
    with pytest.raises(CurveBankError, match="other.parquet"):
        load_bank(path)


def test_resmooth_reproduces_the_trainers_live_smoothing() -> None:
    # A bank's smoothed_loss can be re-derived from its interval means: resmooth() on a real
    # run (including its short last interval) gives the trainer's own smoothed values.
    import json

    from hpo.trials.curve_bank import resmooth
    from trainers.train import Trainer

    config = {"model": {"d_model": 32, "n_layers": 2, "d_head": 16, "seq_len": 32, "base_d_model": 32},
              "batch_size": 512, "tokens_per_param": 0.5, "lr": 0.02, "tau": 0.3, "log_every": 7,
              "eval_every": None, "eval_tokens": 2048, "threads": 1}
    trainer = Trainer(config)
    records = trainer.run()
    assert trainer.total_steps % 7 != 0  # the last interval is short
    run = {**_run("live", 0.3), "total_tokens": trainer.controls.total_tokens,
           "config_json": json.dumps(trainer.config.model_dump(mode="json"))}
    frame = curve_frame(run, records)
    live = frame["smoothed_loss"].to_numpy()
    frame["smoothed_loss"] = np.nan
    np.testing.assert_allclose(resmooth(frame)["smoothed_loss"].to_numpy(), live, rtol=1e-12)


# A writer process: `python -c WRITER bank prefix n` appends n one-run frames, one at a time.
WRITER = """
import sys
sys.path.insert(0, {tests!r})
from test_curve_bank import _points, _run
from hpo.trials.curve_bank import append_runs, curve_frame
bank, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    append_runs(bank, [curve_frame(_run(f"{{prefix}}{{i}}", 0.1 + i), _points(5))])
"""


def test_concurrent_appends_from_two_processes_lose_nothing(tmp_path: Path) -> None:
    # Two real processes append 40 runs each to one bank at the same time: the bank ends
    # readable with all 80 runs, each complete, and no temporary file is left behind.
    import os
    import subprocess
    import sys

    bank = tmp_path / "bank.parquet"
    script = WRITER.format(tests=str(Path(__file__).resolve().parent))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    writers = [subprocess.Popen([sys.executable, "-c", script, str(bank), prefix, "40"], env=env,
                                stderr=subprocess.PIPE, text=True) for prefix in ("a", "b")]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err[-2000:]
    frame = load_bank(bank)
    counts = frame.groupby("run_id").size()
    assert sorted(counts.index) == sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(40)])
    assert (counts == 5).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank.parquet", "bank.parquet.lock"]
