"""The runnable examples under examples/ do what their docstrings say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_predict_from_csv_predicts_the_held_out_run_within_its_stated_error():
    # examples/partial_run.csv is the first 30% of a held-out bank run; the example's prediction
    # of its final loss lands within 2σ of the banked final, and the script prints it.
    sys.path.insert(0, str(REPO / "examples"))
    try:
        from predict_from_csv import predict_from_csv
    finally:
        sys.path.pop(0)
    out = predict_from_csv(REPO / "examples" / "partial_run.csv")
    bank = pd.read_parquet(REPO / "configs/calibration/decisions_bank.parquet")
    run = bank[(bank.eta == 0.01) & (bank.batch_size == 2048) & (bank.tau == 0.3) & (bank.seed == bank.seed.min())]
    true_final = float(run.sort_values("tokens")["smoothed_loss"].iloc[-1])
    assert out["seen_fraction"] == pytest.approx(0.3, abs=0.01)
    assert abs(out["predicted_final_loss"] - true_final) <= 2 * out["uncertainty"]
    printed = subprocess.run([sys.executable, str(REPO / "examples" / "predict_from_csv.py")],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert printed.returncode == 0, printed.stderr
    assert f"predicted final loss {out['predicted_final_loss']:.4f}" in printed.stdout


def test_own_trainable_example_stops_the_losing_trials_and_prints_why():
    # The example is a demo of early stopping: with the good learning rates first, async stops
    # the worse ones at a rung and prints each decision; the best (lr = 0.01) finishes.
    done = subprocess.run([sys.executable, str(REPO / "examples" / "own_trainable.py")],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    stopped = [line for line in lines if ": STOPPED at t̂ = " in line]
    assert len(stopped) >= 1 and all("predicted final" in line for line in stopped)
    assert any(line.startswith("lr=0.01: completed") for line in lines), done.stdout[-2000:]
    assert any(line.startswith("compute used: ") for line in lines)


def test_the_readme_trainable_snippet_reports_every_control_the_scheduler_reads():
    # The README's own-trainable snippet is what users copy: it must report the required
    # controls, the schedule (else 'linear' is assumed) and n_params (else a predictor
    # calibrated on sizes warns NParamsMissingWarning).
    import re

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Using CollapseScheduler with your own trainable", 1)[1].split("\n## ", 1)[0]
    report = section.split("tune.report({", 1)[1].split("})", 1)[0]
    keys = set(re.findall(r'"([a-z_]+)":', report))
    assert {"loss", "train_fraction", "tau", "tokens_per_param", "schedule", "warmup_fraction", "n_params"} <= keys
