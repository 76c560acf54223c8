"""Do our trainer's loss curves collapse? A model-size ladder at fixed τ and TPP.

Three experiments, each printed as a table:

1. **fixed τ**: ≥ 3 widths (spanning ≥ 8× in non-embedding N) at one τ, TPP 20, one batch
   size. Each train-loss curve is smoothed (trailing mean over ``--smoothing`` of its
   tokens), divided by its final value, and the pairwise mean absolute difference of the
   normalised curves over t̂ ∈ [0.2, 1] is printed. Collapse means small differences.
2. **fixed λ, batch grown with size**: the same widths with the base decay λ of the first
   rung held fixed and B multiplied by ``--batch-growth`` per rung, so τ = B/(η·λ·D)
   varies; the same differences are printed. Collapse should be worse than in (1).
3. **seed noise**: the smallest rung of (1) with 2-3 seeds (init and data seed together);
   the pairwise differences give the noise floor to read (1) and (2) against.

Runs go through `trainers.train.Trainer` in parallel worker processes (one thread each).

Usage:
    python benchmarks/collapse_ladder.py --quick                 # ~1-2 minutes, tiny models
    python benchmarks/collapse_ladder.py --widths 64,128,192 --jobs 2
Default sizes: widths 64, 128, 192 at 2 layers (N ≈ 0.10M, 0.39M, 0.89M, 8.8×); on a
2-core CPU the full default takes about an hour.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictors.equations import normalized_loss  # noqa: E402
from predictors.smoothing import trailing_mean  # noqa: E402
from trainers.config import TrainConfig, override, run_controls  # noqa: E402

T_HAT_FROM = 0.2  # the paper compares normalised curves over t̂ ∈ [0.2, 1]
GRID = np.linspace(T_HAT_FROM, 1.0, 161)


def base_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {
                "d_model": args.widths[0],
                "n_layers": args.layers,
                "d_head": args.d_head,
                "seq_len": args.seq_len,
                "base_d_model": args.widths[0],
                "base_n_layers": args.layers,
            },
            "tokens_per_param": args.tpp,
            "batch_size": args.batch,
            "lr": args.lr,
            "tau": args.tau,
            "threads": 1,
            "eval_every": None,
            "eval_tokens": 8192,
        }
    )


def with_log_every(config: TrainConfig, points: int = 250) -> TrainConfig:
    """~``points`` log records per run, so every curve has the same resolution in t̂."""
    steps = run_controls(config).total_steps
    return override(config, {"log_every": max(1, steps // points)})


def train_curve(config_json: dict[str, Any]) -> dict[str, Any]:
    """Worker: run one config; return its controls and raw curve."""
    import torch

    torch.set_num_threads(1)
    from trainers.train import Trainer

    trainer = Trainer(config_json)
    start = time.perf_counter()
    history = trainer.run()
    return {
        "controls": trainer.controls.to_dict(),
        "status": trainer.status,
        "seconds": time.perf_counter() - start,
        "train_fraction": [r["train_fraction"] for r in history],
        "tokens": [r["tokens"] for r in history],
        "train_loss": [r["train_loss"] for r in history],
    }


def normalised_curve(run: dict[str, Any], smoothing_fraction: float) -> tuple[np.ndarray, float]:
    """Smoothed train loss on GRID divided by its final value, and that final value."""
    tokens = np.asarray(run["tokens"], dtype=float)
    window = smoothing_fraction * run["controls"]["total_tokens"]
    smoothed = trailing_mean(tokens, run["train_loss"], window)
    final = float(smoothed[-1])
    curve = np.interp(GRID, np.asarray(run["train_fraction"]), normalized_loss(smoothed, final))
    return curve, final


def pairwise_table(title: str, labels: list[str], runs: list[dict[str, Any]], smoothing: float) -> list[float]:
    """Print each run and the pairwise mean |ℓ_a − ℓ_b| over t̂ ∈ [0.2, 1]; return the differences."""
    print(f"\n== {title}")
    print(f"{'run':>14} {'N':>9} {'steps':>6} {'B':>6} {'tau':>7} {'lambda':>8} {'final':>7} {'status':>9} {'time':>6}")
    curves = []
    for label, run in zip(labels, runs):
        c = run["controls"]
        curve, final = normalised_curve(run, smoothing)
        curves.append(curve)
        print(
            f"{label:>14} {c['n_params']:>9,} {c['total_steps']:>6} {c['batch_size']:>6} {c['tau']:>7.3f}"
            f" {c['weight_decay']:>8.4f} {final:>7.4f} {run['status']:>9} {run['seconds']:>5.0f}s"
        )
    differences = []
    for (i, a), (j, b) in itertools.combinations(enumerate(curves), 2):
        difference = float(np.mean(np.abs(a - b)))
        differences.append(difference)
        print(f"  {labels[i]} vs {labels[j]}: mean |Δℓ| over t̂∈[{T_HAT_FROM}, 1] = {difference:.2%}")
    return differences


def _indexed(item: tuple[int, dict]) -> tuple[int, Any]:
    index, config = item
    return index, train_curve(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[64, 128, 192])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-head", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048, help="tokens per step (fixed-τ ladder)")
    parser.add_argument("--batch-growth", type=float, default=2.0, help="B multiplier per rung (fixed-λ ladder)")
    parser.add_argument("--tpp", type=float, default=20.0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--tau", type=float, default=0.3)
    parser.add_argument("--seeds", type=int, default=3, help="seeds for the noise floor (2-3)")
    parser.add_argument("--smoothing", type=float, default=0.02, help="smoothing window, fraction of D")
    parser.add_argument("--jobs", type=int, default=2, help="parallel runs (one thread each)")
    parser.add_argument("--quick", action="store_true", help="widths 32,64,96, d_head 16, seq 32, TPP 2")
    args = parser.parse_args()
    if args.quick:
        args.widths, args.d_head, args.seq_len, args.batch, args.tpp = [32, 64, 96], 16, 32, 512, 2.0
        args.lr, args.seeds = 2e-2, 2

    base = base_config(args)
    # 1. fixed τ: only the width changes (the base shape stays the first rung).
    fixed_tau = [with_log_every(override(base, {"model.d_model": w})) for w in args.widths]
    # 2. fixed λ = the first rung's, B grown per rung (whole sequences), τ follows.
    weight_decay = run_controls(fixed_tau[0]).weight_decay
    fixed_lambda = []
    for rung, width in enumerate(args.widths):
        batch = int(round(args.batch * args.batch_growth**rung / args.seq_len)) * args.seq_len
        fixed_lambda.append(
            with_log_every(override(base, {"model.d_model": width, "batch_size": batch, "weight_decay": weight_decay}))
        )
    # 3. seeds of the smallest rung (init and data order both change).
    seeds = [
        with_log_every(override(fixed_tau[0], {"seed": s, "data.data_seed": s})) for s in range(1, args.seeds)
    ]
    configs = fixed_tau + fixed_lambda + seeds
    print(f"{len(configs)} runs, {args.jobs} at a time; TPP {args.tpp}, lr {args.lr}, base τ {args.tau}")
    started = time.monotonic()
    runs: list = [None] * len(configs)
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        # A line per finished run: the default ladder takes about half an hour.
        jobs = pool.imap_unordered(_indexed, list(enumerate(c.model_dump() for c in configs)))
        for done, (index, run) in enumerate(jobs, start=1):
            runs[index] = run
            print(f"  [{done}/{len(configs)}] run {index} finished after "
                  f"{time.monotonic() - started:.0f} s", flush=True)

    n = len(args.widths)
    width_labels = [f"d={w}" for w in args.widths]
    tau_diffs = pairwise_table(f"1. fixed τ = {args.tau}, B = {args.batch}", width_labels, runs[:n], args.smoothing)
    lambda_diffs = pairwise_table(
        f"2. fixed λ = {weight_decay:.4f}, B × {args.batch_growth:g} per rung (τ varies)",
        width_labels,
        runs[n : 2 * n],
        args.smoothing,
    )
    seed_labels = [f"d={args.widths[0]} s={s}" for s in range(args.seeds)]
    seed_diffs = pairwise_table("3. seed noise (smallest rung of 1)", seed_labels, [runs[0], *runs[2 * n :]], args.smoothing)
    print("\nsummary: mean pairwise |Δℓ| over t̂ ∈ [0.2, 1]")
    print(f"  fixed τ ladder  {np.mean(tau_diffs):.2%}   (max {np.max(tau_diffs):.2%})")
    print(f"  fixed λ ladder  {np.mean(lambda_diffs):.2%}   (max {np.max(lambda_diffs):.2%})")
    if seed_diffs:
        print(f"  seed noise      {np.mean(seed_diffs):.2%}   (max {np.max(seed_diffs):.2%})")


if __name__ == "__main__":
    main()
