"""Trainer throughput: tokens/s and achieved FLOP/s, µP/CompleteP vs plain SP, threads vs processes.

For each model size it measures, in the same run:

* ``completep``  our Trainer (CompleteP, at a shape away from the base so every multiplier
                 and per-group setting is active);
* ``sp``         our Trainer with parameterization "sp";
* ``plain``      a minimal standard-parameterization GPT of the same architecture written
                 in this file (one AdamW group, no multipliers), trained by a bare loop with
                 the same data sampling, as the "µP must cost nothing" reference;

each under two CPU layouts: one process with 2 threads, and 2 concurrent processes with 1
thread each (the aggregate is the sum of the two). Within a process the three
implementations alternate in short rounds, so background load hits them alike.
Target: completep within 10% of plain.

FLOP per token (training, forward + backward) =
    6·(N + 256·d)          matmul parameters (non-embedding N plus lm_head; the embedding is a lookup)
  + 12·L·T·d               attention scores and mixing over the full T×T masked matrix
Achieved FLOP/s = FLOP per token × tokens/s.

Usage:  python benchmarks/trainer_throughput.py [--seconds 8] [--sizes 0.1M,1M,3M] [--quick]
Default total runtime is a few minutes (sizes × 2 layouts × 3 implementations × seconds,
plus model building and warmup).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Shapes: (d_model, n_layers) giving ~0.1M, ~1M and ~3M non-embedding parameters.
SIZES: dict[str, tuple[int, int]] = {"0.1M": (64, 2), "1M": (128, 5), "3M": (256, 4)}
SEQ_LEN = 128
BATCH_TOKENS = 4096
D_HEAD = 32
IMPLEMENTATIONS = ("plain", "completep", "sp")  # plain first: the others are compared to it


def flop_per_token(n_params: int, d_model: int, n_layers: int, seq_len: int) -> float:
    return 6.0 * (n_params + 256 * d_model) + 12.0 * n_layers * seq_len * d_model


def _train_config(implementation: str, d_model: int, n_layers: int, threads: int) -> dict[str, Any]:
    return {
        "model": {
            "d_model": d_model,
            "n_layers": n_layers,
            "d_head": D_HEAD,
            "seq_len": SEQ_LEN,
            # Base 32 x 1: every size is away from the base, so all µP factors are live.
            "base_d_model": 32,
            "base_n_layers": 1,
            "parameterization": "sp" if implementation == "sp" else "completep",
        },
        "batch_size": BATCH_TOKENS,
        "tokens_per_param": 1e4,  # long enough never to finish during a measurement
        "lr": 3e-3,
        "tau": 0.3,
        "log_every": 2,
        "threads": threads,
    }


def _plain_loop(d_model: int, n_layers: int, threads: int) -> tuple[Any, int]:
    """A bare SP GPT with the same architecture and data; returns (step function, N)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from trainers.config import DataConfig, default_ffn_dim
    from trainers.data import TrainSampler, load_corpus, split_corpus
    # The attention function is shared on purpose: the comparison is about the
    # parameterization and the training loop, not the attention kernel.
    from trainers.model import alibi_bias, attend

    torch.set_num_threads(threads)
    d_ff, n_heads = default_ffn_dim(d_model), d_model // D_HEAD

    class PlainBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.RMSNorm(d_model, eps=1e-5)
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.norm2 = nn.RMSNorm(d_model, eps=1e-5)
            self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=False)
            self.down = nn.Linear(d_ff, d_model, bias=False)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, n_heads, D_HEAD).permute(2, 0, 3, 1, 4)
            y = attend(q, k, v, bias, 1.0 / math.sqrt(D_HEAD))
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d_model))
            gate, up = self.gate_up(self.norm2(x)).split(d_ff, dim=-1)
            return x + self.down(F.silu(gate) * up)

    class PlainGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, d_model)
            self.blocks = nn.ModuleList(PlainBlock() for _ in range(n_layers))
            self.norm = nn.RMSNorm(d_model, eps=1e-5)
            self.head = nn.Linear(d_model, 256, bias=False)
            self.register_buffer("bias", alibi_bias(n_heads, SEQ_LEN), persistent=False)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x, self.bias)
            return F.cross_entropy(self.head(self.norm(x)).view(-1, 256), targets.reshape(-1))

    model = PlainGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    train, _ = split_corpus(load_corpus(DataConfig()).tokens, 0.1)
    sampler = TrainSampler(train, SEQ_LEN, data_seed=0)
    n_params = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("embed", "head")))

    def step() -> None:
        inputs, targets = sampler.sample(BATCH_TOKENS // SEQ_LEN)
        model(inputs, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, n_params


def _steppers(size: str, threads: int) -> tuple[dict[str, Any], int]:
    """One optimizer-step function per implementation, all in this process."""
    from trainers.train import Trainer

    d_model, n_layers = SIZES[size]
    plain_step, n_params = _plain_loop(d_model, n_layers, threads)
    steppers: dict[str, Any] = {"plain": plain_step}
    for implementation in ("completep", "sp"):
        trainer = Trainer(_train_config(implementation, d_model, n_layers, threads))
        assert trainer.controls.n_params == n_params
        # _train_step is the whole hot loop (schedule, sampling, forward, backward, AdamW);
        # train_interval only adds one float conversion per log interval.
        steppers[implementation] = trainer._train_step
    return steppers, n_params


def measure(size: str, threads: int, seconds: float, queue: Any) -> None:
    """Worker: alternate the implementations in short rounds until each has run ``seconds``.

    Interleaving makes the comparison robust to load from other processes on the machine.
    Puts ({implementation: tokens/s}, N) on the queue.
    """
    os.environ["OMP_NUM_THREADS"] = str(threads)
    steppers, n_params = _steppers(size, threads)
    for step in steppers.values():  # warmup: allocator, oneDNN primitive caches
        step()
        step()
    elapsed = {name: 0.0 for name in steppers}
    steps = {name: 0 for name in steppers}
    while min(elapsed.values()) < seconds:
        for name, step in steppers.items():
            start = time.perf_counter()
            for _ in range(3):
                step()
            elapsed[name] += time.perf_counter() - start
            steps[name] += 3
    queue.put(({name: steps[name] * BATCH_TOKENS / elapsed[name] for name in steppers}, n_params))


def run_layout(size: str, processes: int, threads: int, seconds: float) -> tuple[dict[str, float], int]:
    """Aggregate tokens/s per implementation of ``processes`` concurrent workers."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=measure, args=(size, threads, seconds, queue)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
    totals = {name: sum(rates[name] for rates, _ in results) for name in IMPLEMENTATIONS}
    return totals, results[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement time per cell (after warmup)")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {list(SIZES)}")
    parser.add_argument("--quick", action="store_true", help="0.1M only, 2 s per cell")
    args = parser.parse_args()
    sizes = ["0.1M"] if args.quick else args.sizes.split(",")
    seconds = 2.0 if args.quick else args.seconds
    layouts = (("1 proc x 2 thr", 1, 2), ("2 proc x 1 thr", 2, 1))

    print(f"seq_len {SEQ_LEN}, batch {BATCH_TOKENS} tokens/step, d_head {D_HEAD}, fp32, {seconds:.0f} s per cell")
    print(f"{'size':>5} {'N':>9} {'layout':>15} {'impl':>10} {'tok/s':>9} {'GFLOP/s':>8} {'vs plain':>9}")
    for size in sizes:
        d_model, n_layers = SIZES[size]
        for label, processes, threads in layouts:
            rates, n_params = run_layout(size, processes, threads, seconds)
            for implementation in IMPLEMENTATIONS:
                rate = rates[implementation]
                flops = flop_per_token(n_params, d_model, n_layers, SEQ_LEN) * rate
                print(
                    f"{size:>5} {n_params:>9,} {label:>15} {implementation:>10} {rate:>9,.0f}"
                    f" {flops / 1e9:>8.1f} {rate / rates['plain']:>9.3f}",
                    flush=True,
                )

if __name__ == "__main__":
    main()
