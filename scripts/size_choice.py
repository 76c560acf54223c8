"""The leave-one-size-out part of a calibration alone: which size method ``hpo calibrate`` would
ship for a calibration config and why, with each method's error per held-out size and the paired
differences per held-out curve the choice used.

A full ``hpo calibrate`` also measures the leave-one-out, cross-scale and ranking errors (hundreds
of refits on a large bank); this answers the first question in a few dozen refits, for a config
such as ``configs/calibration/default_sizes.yaml`` before it is considered for shipping.

Run::

    python scripts/size_choice.py configs/calibration/default_sizes.yaml [--out runs/size_choice.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration import held_out, size_choice  # noqa: E402
from hpo.calibration.calibrate import _banked_runs, _resolve, load_calibration_config  # noqa: E402
from hpo.calibration.fit import complete_curves  # noqa: E402
from hpo.trials.curve_bank import bank_curves, fill_epochs  # noqa: E402
from predictors.io import atomic_write_json  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--out", default="runs/size_choice.json")
    args = p.parse_args(argv)
    config = load_calibration_config(args.config)
    curves, _ = complete_curves(bank_curves(fill_epochs(_banked_runs(config, _resolve(config.bank)))))
    base = {"t_min": config.fit.t_min, "fit_m": config.fit.fit_m, "fit_irreducible": config.fit.irreducible_loss}
    if not size_choice.spans_sizes(curves):
        print(f"{args.config}: one model size; nothing to choose", file=sys.stderr)
        return 2
    choice = size_choice.choose_size_method(curves, fit_kwargs=base, refits=held_out.Refits(curves),
                                            progress=lambda m: print(f"  {m}", flush=True))
    rows = {name: {f"{g.value:.0f}": {f"{s:g}": r for s, r in zip(held.fractions, g.rms())}
                   for g in held.groups if g.scheme == held.scheme} for name, held in choice.held.items()}
    for name, groups in rows.items():
        print(f"{name}: score {100 * choice.scores[name]:.2f}%")
        for n, by_s in groups.items():
            print(f"    N {n:>8}: RMS " + " / ".join(f"{100 * v:.2f}%" for v in by_s.values()))
    for c in choice.comparisons:
        print(f"  {c.words()}")
    print(f"chosen: {choice.why}")
    atomic_write_json(args.out, {"config": args.config, "n_curves": len(curves), "chosen": choice.chosen.name,
                                 "why": choice.why, "rms_per_size": rows,
                                 "paired": [c.to_dict() for c in choice.comparisons]})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
