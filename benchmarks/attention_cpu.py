"""Attention on CPU: float-mask SDPA (what the trainer runs on CPU) against FlexAttention
with the ALiBi score_mod and causal BlockMask (what it runs on CUDA), at the trainer
benchmark's shapes (32 sequences × T 128 × d_head 32 per step; 2, 4 and 8 heads at 0.1M, 1M
and 3M parameters).

FlexAttention has no backward on CPU in torch 2.13, so it cannot train there at all; the
forward pass is compared (compiled, as on CUDA), and SDPA's forward+backward is given for
scale. Each timing is the median of ``--repeats`` runs of ``--iters`` calls, after warm-up.

Usage:
    nice -n 5 python benchmarks/attention_cpu.py [--heads 4,8] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.model import alibi_bias, alibi_slopes, attend, flex_alibi  # noqa: E402

BATCH, SEQ, D_HEAD = 32, 128, 32


def timed(function: Callable[[], object], iters: int, repeats: int) -> float:
    """Median milliseconds per call."""
    function()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            function()
        runs.append((time.perf_counter() - start) / iters * 1e3)
    return statistics.median(runs)


def measure(heads: int, iters: int, repeats: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, heads, SEQ, D_HEAD, generator=generator) for _ in range(3))
    bias, slopes, scale = alibi_bias(heads, SEQ)[None], alibi_slopes(heads), D_HEAD**-0.5
    start = time.perf_counter()
    flex_alibi(q, k, v, slopes, scale, compiled=True)
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        sdpa = timed(lambda: attend(q, k, v, bias, scale), iters, repeats)
        flex = timed(lambda: flex_alibi(q, k, v, slopes, scale, compiled=True), iters, repeats)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn_like(q)

    def sdpa_train() -> None:
        torch.autograd.grad(attend(qg, kg, vg, bias, scale), (qg, kg, vg), grad)

    return {"heads": heads, "sdpa_fwd_ms": sdpa, "flex_fwd_ms": flex,
            "sdpa_fwd_bwd_ms": timed(sdpa_train, iters, repeats), "flex_compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="4,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), B {BATCH} x T {SEQ} x d_head {D_HEAD}")
    print("| heads | SDPA float mask fwd (ms) | Flex compiled fwd (ms) | Flex / SDPA | SDPA fwd+bwd (ms) | Flex compile (s) |")
    print("|---|---|---|---|---|---|")
    for heads in (int(h) for h in args.heads.split(",")):
        r = measure(heads, args.iters, args.repeats)
        print(f"| {heads} | {r['sdpa_fwd_ms']:.2f} | {r['flex_fwd_ms']:.2f} | {r['flex_fwd_ms'] / r['sdpa_fwd_ms']:.2f}x "
              f"| {r['sdpa_fwd_bwd_ms']:.2f} | {r['flex_compile_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
