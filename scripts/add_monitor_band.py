"""Add the collapse-residual monitor band to a shipped predictor JSON, and nothing else.

    python scripts/add_monitor_band.py [--config configs/calibration/default.yaml]
                                       [--predictor hpo/data/predictors/default.json]

The band is what ``hpo calibrate CONFIG`` measures (``hpo.calibration.fit.monitor_band``: the
calibration's complete banked curves against the predictor, in-sample), so regenerating the
file with ``hpo calibrate`` gives the same ``monitor`` section. Every other byte of the file's
content is kept: it is read as JSON, the one key is inserted before ``provenance`` (where
``Predictor.to_dict`` writes it) and the document is written back atomically.
"""

from __future__ import annotations

import argparse
import json
import warnings

from hpo.calibration.calibrate import _resolve, load_calibration_config
from hpo.calibration.fit import complete_curves, monitor_band
from hpo.trials.curve_bank import bank_curves, load_bank, run_id_of
from predictors import Predictor
from predictors.io import atomic_write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/calibration/default.yaml")
    parser.add_argument("--predictor", default="hpo/data/predictors/default.json")
    args = parser.parse_args()
    config = load_calibration_config(args.config)
    frame = load_bank(_resolve(config.bank))
    frame = frame[frame["run_id"].isin({run_id_of(c) for c in config.runs()})]
    curves, _ = complete_curves(bank_curves(frame))
    predictor = Predictor.load(args.predictor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # N is in every banked curve's meta
        band = monitor_band(curves, predictor)
    if band is None:
        raise SystemExit(f"{args.config}: fewer than 3 complete curves; no band")
    with open(args.predictor) as f:
        doc = json.load(f)
    out = {}
    for key, value in doc.items():
        if key == "provenance":
            out["monitor"] = band.to_dict()
        if key != "monitor":
            out[key] = value
    out.setdefault("monitor", band.to_dict())
    Predictor.from_dict(out, source=args.predictor)  # the result must load
    atomic_write_json(args.predictor, out)
    print(f"{args.predictor}: monitor band from {band.n_curves} curves, "
          f"σ(t̂) {min(band.scale):.4f}-{max(band.scale):.4f}")


if __name__ == "__main__":
    main()
