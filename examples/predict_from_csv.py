"""Predict a new run's final loss from the first part of its curve, read from a CSV.

The file has one row per logged point, in the columns of ``configs/curves/README.md`` (read by
``hpo.calibration.curve_import``, as ``hpo calibrate --from-curves`` reads them): ``tokens`` (or ``step`` or
``train_fraction``) and a (smoothed) training ``loss``, plus the run's controls on every row (τ,
or η, B and λ to derive it; TPP; N; schedule and warmup; ``total_tokens`` is optional, D = TPP·N). ``examples/partial_run.csv`` is the first 30%
of a held-out run (η = 0.01, B = 2,048 tokens, τ = 0.3, TPP 40, N = 100,672) that the shipped
predictor was not calibrated on; its true final loss is 1.5668.

    python examples/predict_from_csv.py [examples/partial_run.csv] [--predictor PREDICTOR.json]

``--predictor`` takes a predictor of your own (``hpo calibrate`` writes one); the default is the
shipped one. A file it cannot read is one line naming the file and the column, exit status 2.

The ± is the predictor's calibrated 1σ relative error at this fraction of training, for a run
this far from the calibrated scale (TPP 40 is between the calibration's 20 and 80: a
cross-scale error). The
predictor is calibrated for ranking runs within a sweep; an absolute value off the calibrated
scale can be biased by more than that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from hpo.calibration.curve_import import CurveImportError, load_curves_file
from hpo.data import default_predictor_path
from predictors import Predictor

HERE = Path(__file__).resolve().parent


def predict_from_csv(path: Path, predictor_path: Optional[Path] = None) -> dict:
    """The predicted final loss of the one run in ``path`` (a partial curve), by the predictor at
    ``predictor_path`` (default: the shipped one)."""
    imported = load_curves_file(path, complete_only=False)  # a partial run is the point here
    if len(imported.curves) != 1:
        names = ", ".join(str(c.meta.get("name")) for c in imported.curves)
        raise CurveImportError(f"{path}: holds {len(imported.curves)} runs ({names}); give a file with one")
    curve = imported.curves[0]
    predictor = Predictor.load(predictor_path or default_predictor_path())
    prediction = predictor.predict_final(curve.t_hat, curve.loss, curve.controls)
    return {"run_id": str(curve.meta.get("name")), "seen_fraction": float(curve.t_hat[-1]),
            "loss_now": float(curve.loss[-1]), "predicted_final_loss": prediction.final_loss,
            "uncertainty": prediction.uncertainty, "error_source": prediction.error_source,
            "tau": curve.controls.tau, "notes": list(imported.notes)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", default=str(HERE / "partial_run.csv"),
                        help="curve file of one (partial) run: CSV or parquet (default: examples/partial_run.csv)")
    parser.add_argument("--predictor", help="predictor JSON (default: the shipped one)")
    args = parser.parse_args(argv)
    try:
        out = predict_from_csv(Path(args.csv), Path(args.predictor) if args.predictor else None)
    except (CurveImportError, OSError, ValueError) as exc:  # a missing or malformed file: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in out["notes"]:
        print(f"note: {note}")
    print(f"{out['run_id']}: seen t̂ = {out['seen_fraction']:.2f} of training (τ = {out['tau']:.3g}), "
          f"loss now {out['loss_now']:.4f}")
    print(f"predicted final loss {out['predicted_final_loss']:.4f} ± {out['uncertainty']:.4f} "
          f"(1σ; error: {out['error_source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
