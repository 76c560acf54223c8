"""How often the shipped default's early answer, and the sweep's final pick, are within seed noise,
per kind of sweep, on the decision banks of three corpora (every trial trained to the end).

The README's quickstart paragraph quotes the η-at-fixed-τ row: the quickstart is that kind of
sweep. Each replicate (one kind, one seed) is replayed once through the shipped default
(``SchedulerSettings()``) with the shipped predictor, by the one replay engine
(``hpo.trials.rule_replay.simulate``): the early answer is the trial the scheduler announced at its
last rung, the final pick the finished trial with the lowest final; each is within noise when
its regret ≤ σ_seed of the kind (``hpo.trials.replay.seed_noise``). The banks are at TPPs and
seeds no calibration used; the default was chosen on these banks among others
(``benchmarks/decisions.md`` has each corpus held out).

Run::

    python benchmarks/early_answer_by_kind.py [--config BANK.yaml ...] [--predictor FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decisions_replay import replicates  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from hpo.trials import rule_replay  # noqa: E402
from hpo.trials.replay import run_points, seed_noise, true_finals  # noqa: E402
from predictors import Predictor  # noqa: E402
from predictors.curves import is_finished  # noqa: E402
from predictors.kinds import SWEEP_KINDS  # noqa: E402

BANKS = ("configs/calibration/decisions.yaml", "configs/calibration/decisions_perl.yaml",
         "configs/calibration/decisions_cheaders.yaml")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", nargs="+", default=list(BANKS), help="decision-bank calibration YAML(s)")
    parser.add_argument("--predictor", default="hpo/data/predictors/default.json", help="predictor JSON")
    args = parser.parse_args(argv)
    predictor = Predictor.load(args.predictor)
    default = next(s for s in rule_replay.settings(predictor, quick=True) if s.default)
    counts: dict[str, list[int]] = {}
    for config in args.config:
        frame, complete, _ = replicates(config)
        finals = true_finals(frame, "smoothed_loss")
        for (kind, _seed), runs in sorted(complete.items()):
            sigma = seed_noise(frame, [r for k, v in complete.items() if k[0] == kind for r in v], finals=finals).std
            reached, scheduler = rule_replay.simulate(default, {r: run_points(frame, r) for r in runs})
            answer = scheduler.state.early_answer
            best = min(finals[r] for r in runs)
            pick = min((r for r in runs if is_finished(reached[r])), key=lambda r: finals[r])
            row = counts.setdefault(SWEEP_KINDS.get(kind, kind), [0, 0, 0, 0])
            row[0] += 1
            row[1] += answer is not None and sigma is not None and finals[answer["trial_id"]] - best <= sigma + 1e-12
            row[2] += sigma is not None and finals[pick] - best <= sigma + 1e-12
            row[3] += 0 if answer is None else 1
    print(f"default `{default.label}`, predictor {args.predictor}, banks {', '.join(args.config)}")
    print(markdown_table(["kind of sweep", "replicates", "early answer within σ_seed", "final pick within σ_seed"],
                         [[k, n, f"{ea}/{answered}", f"{fp}/{n}"] for k, (n, ea, fp, answered) in counts.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
