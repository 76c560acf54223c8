"""Predict a new run's final loss from the first part of its curve, read from a CSV.

The file has one row per logged point, in the columns of ``configs/curves/README.md``:
``tokens`` and a (smoothed) training ``loss``, plus the run's controls on every row (τ, or η, B
and λ to derive it; TPP; N; schedule and warmup). ``examples/partial_run.csv`` is the first 30%
of a held-out run (η = 0.01, B = 2,048 tokens, τ = 0.3, TPP 40, N = 100,672) that the shipped
predictor was not calibrated on; its true final loss is 1.5668.

    python examples/predict_from_csv.py [examples/partial_run.csv]

The ± is the predictor's calibrated 1σ relative error at this fraction of training, for a run
this far from the calibrated scale (TPP 40 is between the calibration's 20 and 80: a
cross-scale error). The
predictor is calibrated for ranking runs within a sweep; an absolute value off the calibrated
scale can be biased by more than that.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from predictors import Controls, Predictor
from predictors.equations import adamw_timescale

HERE = Path(__file__).resolve().parent
# The shipped predictor, read by path so the example runs without importing the hpo service.
PREDICTOR = HERE.parent / "hpo" / "data" / "predictors" / "default.json"


def predict_from_csv(path: Path, predictor_path: Path = PREDICTOR) -> dict:
    """The predicted final loss of the one run in ``path`` (a partial curve)."""
    rows = pd.read_csv(path).sort_values("tokens")
    first = rows.iloc[0].to_dict()
    if "tau" not in first or pd.isna(first.get("tau")):
        # τ = B/(η·λ·D), paper Eq. 2; λ = 0 is the τ = ∞ limit.
        decay = float(first["weight_decay"])
        first["tau"] = (adamw_timescale(first["batch_size"], first["eta"], decay, first["total_tokens"])
                        if decay > 0 else math.inf)
    controls = Controls.from_mapping(first)
    t_hat = rows["tokens"].to_numpy(float) / float(first["total_tokens"])
    predictor = Predictor.load(predictor_path)
    prediction = predictor.predict_final(t_hat, rows["loss"].to_numpy(float), controls)
    return {"run_id": str(first["run_id"]), "seen_fraction": float(t_hat[-1]),
            "loss_now": float(rows["loss"].iloc[-1]), "predicted_final_loss": prediction.final_loss,
            "uncertainty": prediction.uncertainty, "error_source": prediction.error_source, "tau": controls.tau}


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else HERE / "partial_run.csv"
    out = predict_from_csv(path)
    print(f"{out['run_id']}: seen t̂ = {out['seen_fraction']:.2f} of training (τ = {out['tau']:.3g}), "
          f"loss now {out['loss_now']:.4f}")
    print(f"predicted final loss {out['predicted_final_loss']:.4f} ± {out['uncertainty']:.4f} "
          f"(1σ; error: {out['error_source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
