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
