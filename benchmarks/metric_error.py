"""How well a predictor predicts the final of either loss on held-out runs, beside the error it states.

For every complete run of the decision banks given (``--config``: runs neither predictor was fitted
on), at each decision fraction s, the final is predicted from the curve up to s
(``predictors.prediction.predict_at_rungs``, what the scheduler does at a rung) and compared with the
run's true final of the same metric (``predictors.smoothing.FINAL_LOSS_DEFINITION``). Each
predictor is measured on its own metric and on the other one, so the question "can the
train-loss predictor decide on the validation loss?" is answered by its error on val_loss
curves against the error it states (``Predictor.relative_error``, its calibrated e(s) for that run).

Run::

    python benchmarks/metric_error.py --config configs/calibration/val_loss_decisions.yaml \\
        --predictor loss=runs/calibration/val_loss_train/predictor.json \\
        --predictor val_loss=runs/calibration/val_loss/predictor.json

Prints a markdown table: predictor (its metric), metric predicted, s, runs, RMS and median
|relative error|, the mean stated e(s), and the share of runs within the stated e(s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decisions_replay import replicates  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from predictors.prediction import predict_at_rung  # noqa: E402
from hpo.trials.replay import run_points, true_finals  # noqa: E402
from predictors import Controls, Predictor  # noqa: E402
from predictors.run_keys import METRIC_COLUMNS  # noqa: E402

FRACTIONS = (0.1, 0.2, 0.3, 0.5)


def errors(predictor: Predictor, configs: Sequence[str], metric: str) -> list[list[str]]:
    """Rows (one per s) of the predictor's error predicting ``metric``'s final on these banks."""
    column = METRIC_COLUMNS[metric]
    by_s: dict[float, list[tuple[float, float]]] = {s: [] for s in FRACTIONS}
    for config in configs:
        frame, complete, _ = replicates(config, metric)
        finals = true_finals(frame, column)
        for run_id in sorted({r for ids in complete.values() for r in ids}):
            points = run_points(frame, run_id, column)
            t = [p["train_fraction"] for p in points]
            y = [p["loss"] for p in points]
            controls = Controls.from_mapping(points[0])
            for s in FRACTIONS:
                pred = predict_at_rung(predictor, t, y, controls, s)
                if pred.final_loss is None:
                    continue
                stated = predictor.relative_error(s, controls)[0]
                by_s[s].append((pred.final_loss / finals[run_id] - 1.0, stated))
    rows = []
    for s, pairs in by_s.items():
        if not pairs:
            continue
        err = np.array([e for e, _ in pairs])
        stated = np.array([e for _, e in pairs])
        rows.append([f"`{predictor.metric}`", f"`{metric}`", f"{s:g}", len(pairs),
                     f"{100 * np.sqrt(np.mean(err ** 2)):.2f}%", f"{100 * np.median(np.abs(err)):.2f}%",
                     f"{100 * np.mean(stated):.2f}%", f"{100 * np.mean(np.abs(err) <= stated):.0f}%"])
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", nargs="+", required=True, help="decision-bank calibration YAML(s)")
    p.add_argument("--predictor", action="append", required=True, metavar="LABEL=FILE",
                   help="a predictor JSON (repeat); LABEL is for the reader only")
    args = p.parse_args(argv)
    rows = []
    for item in args.predictor:
        _, _, path = item.rpartition("=")
        predictor = Predictor.load(path)
        for metric in METRIC_COLUMNS:
            rows += errors(predictor, args.config, metric)
    print(markdown_table(["predictor fitted on", "final predicted", "s", "runs", "RMS error", "median |error|",
                          "stated e(s), mean", "within stated e(s)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
