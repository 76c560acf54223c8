"""Where predicted-best and current-best pick different trials, and which finished better.

For every B-at-fixed-λ sweep of the decision banks on three corpora (as
``hpo.calibration.ranking_error.ranking_groups`` finds them, with at least MIN_TRIALS trials), at t̂ = 0.1, 0.2 and 0.3: the trial with the lowest predicted final loss (the shipped
predictor, predicted finals alone) against the trial with the lowest loss so far, and both
trials' true finals. This is what a small packaged "crossing" sweep would show a user.

    python benchmarks/pick_disagreement.py [MIN_TRIALS]   # ~1 min; sweeps of >= MIN_TRIALS (5)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.calibration.calibrate import bank_curves, load_bank  # noqa: E402
from hpo.calibration.ranking_error import ranking_groups  # noqa: E402
from hpo.data import default_predictor_path  # noqa: E402
from predictors.prediction import predict_at_rung  # noqa: E402
from predictors import Predictor  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BANKS = ("decisions", "decisions_perl", "decisions_cheaders")


def main(min_trials: int = 5) -> None:
    predictor = Predictor.load(default_predictor_path())
    rows, looks, differ, better = [], 0, 0, 0
    for bank in BANKS:
        curves = bank_curves(load_bank(REPO / f"configs/calibration/{bank}_bank.parquet"))
        # The bank's B-at-fixed-λ sweeps as calibration groups them, those of ≥ MIN_TRIALS trials
        # (the designed 5-trial sweeps; smaller groups are pairs that happen to share a λ).
        for group in (g for g in ranking_groups(curves).get("batch_fixed_lambda", []) if len(g) >= min_trials):
            sweep = [curves[i] for i in group]
            seed = int(sweep[0].meta["seed"])
            finals = [c.final_loss for c in sweep]
            for s in (0.1, 0.2, 0.3):
                at = [predict_at_rung(predictor, c.t_hat, c.loss, c.controls, s) for c in sweep]
                pick_p = int(np.argmin([p.final_loss or np.inf for p in at]))
                pick_l = int(np.argmin([p.loss or np.inf for p in at]))
                looks += 1
                if sweep[pick_p].meta["batch_size"] != sweep[pick_l].meta["batch_size"]:
                    differ += 1
                    better += finals[pick_p] < finals[pick_l]
                    rows.append(f"| {bank} | {seed} | {s:g} | B {sweep[pick_p].meta['batch_size']:.0f}: "
                                f"{finals[pick_p]:.4f} | B {sweep[pick_l].meta['batch_size']:.0f}: "
                                f"{finals[pick_l]:.4f} | {min(finals):.4f} |")
    print("| bank | seed | t̂ | predicted-best: final | current-best: final | best final |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{differ} of {looks} looks pick different trials; predicted-best finished better in {better}.")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
