"""What CollapseScheduler costs the driver, at 10 / 100 / 1,000 / 10,000 trials, with its state persisted.

Each trial reports 50 results (t̂ = 0.02 … 1) of a synthetic curve (the shipped predictor's
ℓ̂ times a final loss, τ drawn per trial); the sweep runs in sync mode with rungs 0.1/0.2/0.3
and the default calibrated margin, through :class:`hpo.trials.simulator.SimulatedSweep` (Ray's
controller semantics) with 8 slots, ``state_path`` in a temporary directory (what ``hpo
sweep`` always does). Every ``on_trial_result`` call is timed:

* **between rungs**: the calls that only extend a trial's curve (median and 99th percentile);
* **rung round**: for each rung, the summed time of the calls that bring the trials to it —
  the last of which decides the rung, stops the losers (``stop_trial``) and persists once;
* **whole simulated sweep**: ``SimulatedSweep(...).run()`` from the controller's set-up to the
  last trial's end (the synthetic curves are made before the clock starts).

Each is given in wall time and in this process's CPU time: on a machine other jobs share, the
wall time is mostly theirs, the CPU time is still this process's.

Targets (issue 14): a rung round at 1,000 trials < 2 s with state persisted; < 20 µs per call
between rungs. Issue 30: at 10,000 trials each rung round < 2 s, the whole simulated sweep
< 20 s, < 1 GB (peak resident memory of this process, which grows with the largest sweep run).

Run::

    python benchmarks/scheduler_cost.py [--trials 10 100 1000 10000] [--mode sync|async] [--md FILE]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.decisions.scheduler import CollapseScheduler  # noqa: E402
from hpo.decisions.scheduler_contract import SchedulerSettings  # noqa: E402
from hpo.trials.simulator import SimulatedSweep  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from hpo.data import default_predictor_path  # noqa: E402
from predictors import Controls, Predictor  # noqa: E402
from predictors.io import atomic_write_text  # noqa: E402

RUNGS = (0.1, 0.2, 0.3)
POINTS = 50


def curves(n: int, predictor: Predictor, seed: int = 0) -> dict[str, list[dict]]:
    rng = np.random.default_rng(seed)
    t = np.arange(1, POINTS + 1) / POINTS
    out = {}
    for i in range(n):
        tau = float(np.exp(rng.uniform(np.log(0.05), np.log(1.6))))
        final = float(rng.uniform(1.6, 1.8))
        loss = final * predictor.normalized_curve(t, Controls(tau, 20.0))
        out[f"t{i:04d}"] = [{"loss": float(v), "train_fraction": float(x), "tau": tau, "tokens_per_param": 20.0,
                             "schedule": "linear", "warmup_fraction": 0.1, "eta": 0.01, "batch_size": 2048}
                            for x, v in zip(t, loss)]
    return out


def measure(n: int, predictor: Predictor, decision_mode: str = "sync") -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = SchedulerSettings(rungs=list(RUNGS), mode=decision_mode)
        scheduler = CollapseScheduler(predictor=predictor, settings=settings,
                                      state_path=Path(tmp) / "scheduler_state.json")
        between: list[float] = []
        rounds, rounds_cpu = [0.0] * len(RUNGS), [0.0] * len(RUNGS)
        plain = scheduler.on_trial_result

        def timed(tc, trial, result):  # noqa: ANN001
            start, start_cpu = time.perf_counter(), time.process_time()
            decision = plain(tc, trial, result)
            spent = time.perf_counter() - start
            t = result["train_fraction"]
            at = [r for r, f in enumerate(RUNGS) if abs(t - f) < 1e-9]
            if at:
                rounds[at[0]] += spent
                rounds_cpu[at[0]] += time.process_time() - start_cpu
            else:
                between.append(spent)
            return decision

        scheduler.on_trial_result = timed  # type: ignore[method-assign]
        runs = curves(n, predictor)  # the synthetic curves are made before the clock starts
        started, started_cpu = time.perf_counter(), time.process_time()
        outcome = SimulatedSweep(scheduler, runs, n_workers=8).run()
        total, total_cpu = time.perf_counter() - started, time.process_time() - started_cpu
        state_kb = (Path(tmp) / "scheduler_state.json").stat().st_size / 1024
    between.sort()
    return {"trials": n, "between_median_us": 1e6 * statistics.median(between),
            "between_p99_us": 1e6 * between[int(0.99 * (len(between) - 1))],
            "round_s": rounds, "total_s": total, "state_kb": state_kb, "round_cpu_s": rounds_cpu,
            "total_cpu_s": total_cpu,
            "compute": outcome.compute_fraction(), "calls": len(between) + n * len(RUNGS),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", nargs="+", type=int, default=[10, 100, 1000, 10000])
    # The shipped predictor, found from the package (not the working directory): runs from anywhere.
    p.add_argument("--predictor", default=str(default_predictor_path()),
                   help="predictor JSON (default: the shipped one)")
    p.add_argument("--md", default=None, help="also write the table to this markdown file")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="decision mode (async: every arrival judged against the recorded predictions)")
    args = p.parse_args(argv)
    predictor = Predictor.load(args.predictor)
    rows = []
    for n in args.trials:
        m = measure(n, predictor, args.mode)
        rows.append([n, f"{m['between_median_us']:.1f}", f"{m['between_p99_us']:.1f}",
                     " / ".join(f"{r:.3f}" for r in m["round_s"]), " / ".join(f"{r:.3f}" for r in m["round_cpu_s"]),
                     f"{m['total_s']:.2f}", f"{m['total_cpu_s']:.2f}", f"{m['state_kb']:.0f}", f"{m['peak_mb']:.0f}"])
        print(f"{n} trials: between rungs {m['between_median_us']:.1f} µs median, rung rounds "
              f"{' / '.join(f'{r:.3f}' for r in m['round_s'])} s (CPU {' / '.join(f'{r:.3f}' for r in m['round_cpu_s'])}"
              f" s), whole sweep {m['total_s']:.2f} s (CPU {m['total_cpu_s']:.2f} s)", flush=True)
    table = markdown_table(["trials", "between rungs, median µs", "p99 µs", "rung round 0.1 / 0.2 / 0.3, s",
                            "same, CPU s", "whole simulated sweep, s", "same, CPU s", "snapshot KB",
                            "peak RSS so far, MB"], rows)
    print(table)
    if args.md:
        atomic_write_text(args.md, "# CollapseScheduler cost per call (state persisted)\n\n"
                          "`python benchmarks/scheduler_cost.py` (wall times vary with machine load; the CPU "
                          "times, this process's, much less).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
