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


def test_predict_from_csv_reads_a_file_without_total_tokens_and_takes_a_predictor(tmp_path):
    # total_tokens is optional (D = TPP·N, configs/curves/README.md): the example raised
    # KeyError 'total_tokens' without it. --predictor picks another predictor file; a file it
    # cannot read is one line, exit 2.
    import shutil

    rows = pd.read_csv(REPO / "examples" / "partial_run.csv")
    bare = tmp_path / "bare.csv"
    rows.drop(columns=["total_tokens"]).to_csv(bare, index=False)
    mine = tmp_path / "mine.json"
    shutil.copyfile(REPO / "hpo" / "data" / "predictors" / "default.json", mine)
    script = str(REPO / "examples" / "predict_from_csv.py")
    with_total = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, cwd=REPO)
    done = subprocess.run([sys.executable, script, str(bare), "--predictor", str(mine)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and with_total.returncode == 0, done.stderr[-2000:]
    predicted = [line for line in done.stdout.splitlines() if line.startswith("predicted final loss")]
    assert predicted and predicted[0] in with_total.stdout  # D = TPP·N: within 0.02% of its total_tokens
    bad = subprocess.run([sys.executable, script, str(bare), "--predictor", str(tmp_path / "absent.json")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "absent.json" in bad.stderr


def test_own_trainable_example_stops_the_losing_trials_and_prints_why():
    # The example is a demo of early stopping: with the good learning rates first, async stops
    # the worse ones at a rung and prints each decision; the best (lr = 0.01) finishes.
    done = subprocess.run([sys.executable, str(REPO / "examples" / "own_trainable.py")],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    stopped = [line for line in lines if ": STOPPED at t̂ = " in line]
    assert all("predicted final" in line for line in stopped)
    # Trials run one at a time in a fixed order: the outcome the docstring states, every time
    # (it stopped 2 or 3 from run to run when two ran at once).
    import ast

    doc = " ".join(ast.get_docstring(ast.parse((REPO / "examples" / "own_trainable.py").read_text())).split())
    assert "the three worse learning rates are stopped at the first rung, t̂ = 0.1, and lr = 0.01 completes" in doc
    assert sorted(line.split(":")[0] for line in stopped) == ["lr=0.001", "lr=0.003", "lr=0.03"], done.stdout
    assert all(": STOPPED at t̂ = 0.1 (" in line for line in stopped), stopped
    assert any(line.startswith("lr=0.01: completed") for line in lines), done.stdout[-2000:]
    assert any(line.startswith("compute used: ") for line in lines)


def test_the_readme_trainable_snippet_reports_every_control_the_scheduler_reads():
    # The README's own-trainable snippet is what users copy: it must report the required
    # controls, the schedule (else 'linear' is assumed) and n_params (else a predictor
    # calibrated on sizes warns NParamsMissingWarning).
    import re

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Your own trainer", 1)[1].split("\n## ", 1)[0]
    report = section.split("tune.report({", 1)[1].split("})", 1)[0]
    keys = set(re.findall(r'"([a-z_]+)":', report))
    assert {"loss", "train_fraction", "tau", "tokens_per_param", "schedule", "warmup_fraction", "n_params"} <= keys
