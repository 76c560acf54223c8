"""Trainer throughput: our trainer against a plain PyTorch GPT and nn.TransformerEncoder.

For each model size (~0.1M, ~1M, ~3M non-embedding parameters N) one process with
``--threads`` threads (default 2) builds these step functions and runs them side by side
in alternating rounds (the order rotates every round), so background load hits them alike:

* ``trainer``        our Trainer: CompleteP at base 32 × 1 layer, so every µP/CompleteP
                     multiplier and per-group AdamW setting is live; ALiBi, SwiGLU, RMSNorm;
* ``trainer-sp``     the same with parameterization "sp" (every multiplier 1): what µP costs;
* ``plain``          a plain GPT written here: pre-LN (LayerNorm), learned positions,
                     ``F.scaled_dot_product_attention(is_causal=True)``, GELU MLP (4·d),
                     fused AdamW with the usual two groups (decay / no decay);
* ``plain+features`` the same GPT with ALiBi (float-mask SDPA, no position embedding),
                     SwiGLU (d_ff = 8/3·d) and µP/CompleteP done the plain way (activation
                     multipliers, per-group AdamW): what the three features cost a plain
                     implementation;
* ``torch-encoder``  ``torch.nn.TransformerEncoder`` (norm_first, GELU, causal mask) with the
                     same embedding, learned positions and head: a library reference;
* ``trainer@baseline`` (with ``--baseline CHECKOUT``) the trainer of another checkout, e.g.
                     the commit before a change, imported next to ours: before/after in one
                     process. ``plain+alibi``, ``plain+swiglu+rmsnorm``, ... time any subset of
                     the features (alibi, swiglu, mup, rmsnorm) one by one.

Every one draws its batches with the trainer's sampler and includes sampling, forward,
backward and the AdamW step. B = 4,096 tokens/step, T = 128, d_head = 32, fp32, no biases.

Reported per size: tokens/s (total tokens / total time), the ratio to ``plain`` and to
``torch-encoder`` (median over rounds of the per-round ratio), and achieved FLOP/s as a
fraction of this CPU's fp32 matmul peak, measured in the same process (largest
``torch.mm`` rate over square sizes 256-2048, before and after the rounds).

FLOP per token (training, forward + backward) =
    6·(N + 256·d)          matmul parameters (non-embedding N plus lm_head; embeddings are lookups)
  + 12·L·T·d               attention scores and mixing over the full T×T matrix

``--compile`` measures torch.compile instead: eager vs compiled trainer steady state in
alternating rounds, and time to first step (build + first step, which includes compiling)
with a cold and with a warm inductor cache.

``--curves OUT.json [--root CHECKOUT]`` trains the collapse ladder's width-64/128 runs with
the trainer of CHECKOUT and stores the curves; ``--compare-curves BEFORE AFTER`` tabulates
the differences (how a trainer change is shown not to move the curves).

On a loaded machine two threads per process measure mostly the contention (an OpenMP
region waits for its slowest thread); ``--threads 1 --cpu-clock`` times each round by the
thread's CPU time instead, which leaves out the time spent waiting for a core.

Usage:
    python benchmarks/trainer_throughput.py [--sizes 0.1M,1M,3M] [--seconds 12] [--threads 2]
    python benchmarks/trainer_throughput.py --baseline ../base-checkout      # before/after
    python benchmarks/trainer_throughput.py --threads 1 --cpu-clock          # under load
    python benchmarks/trainer_throughput.py --compile [--sizes 0.1M,1M]
    python benchmarks/trainer_throughput.py --curves after.json [--root CHECKOUT]
    python benchmarks/trainer_throughput.py --compare-curves before.json after.json
    python benchmarks/trainer_throughput.py --quick           # 0.1M, 3 s per implementation
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# What is timed (shapes, the reference models, build) lives in its own module. The shape state
# that use_device() rebinds there (SEQ_LEN, BATCH_TOKENS, D_HEAD, DEVICE) is read as an
# attribute of that module, never imported by name.
from benchmarks import trainer_throughput_models as models  # noqa: E402
from benchmarks.trainer_throughput_models import (  # noqa: E402
    GPU_IMPLEMENTATIONS, GPU_SEQUENCES, GPU_SIZES, IMPLEMENTATIONS, SIZES, Step, _train_config, build, use_device)

ROUND_SECONDS = 1.0  # time per implementation per round


def flop_per_token(n_params: int, d_model: int, n_layers: int, seq_len: int = models.SEQ_LEN) -> float:
    return 6.0 * (n_params + 256 * d_model) + 12.0 * n_layers * seq_len * d_model


def matmul_peak(seconds_per_size: float = 0.4, clock: Callable[[], float] = time.perf_counter) -> float:
    """This CPU's fp32 matmul rate in FLOP/s at the current thread count: the best
    ``torch.mm`` rate over square sizes 256-2048 (the peak that GEMMs here can reach).
    On CUDA: the bf16 rate over sizes 2048-8192 (``clock`` synchronises)."""
    import torch

    best = 0.0
    cuda = models.DEVICE == "cuda"
    for n in ((2048, 4096, 8192) if cuda else (256, 512, 1024, 2048)):
        kwargs: dict[str, Any] = {"device": "cuda", "dtype": torch.bfloat16} if cuda else {}
        a, b = torch.randn(n, n, **kwargs), torch.randn(n, n, **kwargs)
        out = torch.empty(n, n, **kwargs)
        torch.mm(a, b, out=out)  # warmup
        count, start = 0, clock()
        while (elapsed := clock() - start) < seconds_per_size:
            torch.mm(a, b, out=out)
            count += 1
        best = max(best, 2.0 * n**3 * count / elapsed)
    return best


def alternate(
    steppers: dict[str, Step], seconds: float, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[tuple[int, float]]]:
    """Run the step functions in rounds of ~ROUND_SECONDS each, rotating the order every
    round, until each has run ``seconds``. Returns per-round (steps, elapsed) per name.

    ``clock`` is wall time by default; with one thread, ``time.thread_time`` (CPU time of
    the calling thread, which on CPU also runs the backward) leaves out the time the
    process waits for a core, the main distortion on a loaded machine."""
    names = list(steppers)
    per_step = {}
    for name in names:  # warmup (allocator, oneDNN primitive caches), then size the rounds
        for _ in range(2):
            steppers[name]()
        start = clock()
        steppers[name]()
        per_step[name] = clock() - start
    steps = {name: max(1, round(ROUND_SECONDS / per_step[name])) for name in names}
    rounds: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
    for index in range(max(1, round(seconds / ROUND_SECONDS))):
        order = names[index % len(names):] + names[: index % len(names)]
        for name in order:
            start = clock()
            for _ in range(steps[name]):
                steppers[name]()
            rounds[name].append((steps[name], clock() - start))
    return rounds


def measure(
    size: str, threads: int, seconds: float, implementations: tuple[str, ...], cpu_clock: bool = False,
    baseline: str | None = None, device: str = "cpu", compiled: bool = False,
) -> dict[str, Any]:
    """Worker (one process per size): tokens/s per round of each implementation, N, peak."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    d_model, n_layers = use_device(device, size, compiled)
    clock = time.thread_time if cpu_clock else time.perf_counter
    if device == "cuda":
        torch.set_float32_matmul_precision("high")

        def clock() -> float:  # a round ends when the GPU has done its queued work
            torch.cuda.synchronize()
            return time.perf_counter()
    peak_before = matmul_peak(clock=clock)
    built = {name: build(name, d_model, n_layers, threads, baseline) for name in implementations}
    torch.set_num_threads(threads)  # a Trainer sets it too; make sure every loop gets the same
    rounds = alternate({name: step for name, (step, _) in built.items()}, seconds, clock)
    peak_after = matmul_peak(clock=clock)
    return {
        "size": size,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "shape": [d_model, n_layers, models.SEQ_LEN, models.BATCH_TOKENS],
        "threads": threads,
        "clock": "thread CPU time" if cpu_clock else "wall",
        "n_params": {name: n for name, (_, n) in built.items()},
        "rates": {name: [s * models.BATCH_TOKENS / t for s, t in r] for name, r in rounds.items()},
        "tokens_per_s": {name: sum(s for s, _ in r) * models.BATCH_TOKENS / sum(t for _, t in r) for name, r in rounds.items()},
        "peak_flops": max(peak_before, peak_after),
        "peak_flops_before_after": [peak_before, peak_after],
        "load_average": os.getloadavg(),
    }


def _in_process(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(*args)`` in a fresh spawned process (its own threads and caches)."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def throughput_tables(results: list[dict[str, Any]]) -> str:
    from hpo.common.tables import markdown_table

    rows = []
    for result in results:
        d_model, n_layers, seq_len, _ = result.get("shape") or (*SIZES[result["size"]], models.SEQ_LEN, models.BATCH_TOKENS)
        rates = result["rates"]

        def ratio(name: str, reference: str) -> str:
            if reference not in rates or name not in rates:
                return "—"
            return f"{statistics.median(a / b for a, b in zip(rates[name], rates[reference])):.3f}"

        for name, tokens_per_s in result["tokens_per_s"].items():
            n_params = result["n_params"][name]
            flops = flop_per_token(n_params, d_model, n_layers, seq_len) * tokens_per_s
            rows.append([
                result["size"], f"{n_params:,}", name, f"{tokens_per_s:,.0f}", ratio(name, "plain"),
                ratio(name, "torch-encoder"), f"{flops / 1e9:.1f}", f"{flops / result['peak_flops']:.1%}",
            ])
    peaks = ", ".join(f"{r['size']}: {r['peak_flops'] / 1e9:.0f}" for r in results)
    clock = results[0].get("clock", "wall")
    loads = ", ".join(f"{r['size']}: {r['load_average'][0]:.2f}" for r in results)
    table = markdown_table(
        ["size", "N", "implementation", "tokens/s", "× plain", "× torch-encoder", "GFLOP/s", "of fp32 peak"], rows
    )
    return (f"{table}\n\nclock: {clock}; fp32 matmul peak (GFLOP/s, {results[0]['threads']} threads, same clock): "
            f"{peaks}; 1-min load average at the end: {loads}")


# ---------------------------------------------------------------------- torch.compile
def _first_step_seconds(config: dict[str, Any]) -> tuple[Any, float, float]:
    """(trainer, seconds from Trainer() to the end of its first step, first-step loss)."""
    from trainers.train import Trainer

    start = time.perf_counter()
    trainer = Trainer(config)
    loss = float(trainer._train_step())
    return trainer, time.perf_counter() - start, loss


def measure_compile(size: str, threads: int, seconds: float, cache_dir: str) -> dict[str, Any]:
    """Worker: eager vs compiled trainer; time to first step and steady-state tokens/s."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir  # before torch is imported
    import torch

    torch.set_num_threads(threads)
    d_model, n_layers = SIZES[size]
    eager, eager_first, eager_loss = _first_step_seconds(_train_config("completep", d_model, n_layers, threads, compile=False))
    compiled, compiled_first, compiled_loss = _first_step_seconds(
        _train_config("completep", d_model, n_layers, threads, compile=True)
    )
    assert compiled.compiled and abs(compiled_loss - eager_loss) < 1e-3 * eager_loss, (compiled_loss, eager_loss)
    rounds = alternate({"eager": eager._train_step, "compiled": compiled._train_step}, seconds)
    rates = {name: [s * models.BATCH_TOKENS / t for s, t in r] for name, r in rounds.items()}
    return {
        "size": size,
        "eager_first_s": eager_first,
        "compiled_first_s": compiled_first,
        "tokens_per_s": {name: sum(s for s, _ in r) * models.BATCH_TOKENS / sum(t for _, t in r) for name, r in rounds.items()},
        "ratio": statistics.median(c / e for c, e in zip(rates["compiled"], rates["eager"])),
        "total_steps_tpp20": _steps_at_tpp20(d_model, n_layers),
    }


def measure_warm_compile(size: str, threads: int, cache_dir: str) -> float:
    """Worker: time to first compiled step in a new process whose inductor cache is warm."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch

    torch.set_num_threads(threads)
    d_model, n_layers = SIZES[size]
    return _first_step_seconds(_train_config("completep", d_model, n_layers, threads, compile=True))[1]


def _steps_at_tpp20(d_model: int, n_layers: int) -> int:
    from trainers.config import TrainConfig, run_controls

    config = TrainConfig.model_validate({**_train_config("completep", d_model, n_layers, 1), "tokens_per_param": 20})
    return run_controls(config).total_steps


def compile_table(results: list[dict[str, Any]]) -> str:
    from hpo.common.tables import markdown_table

    rows = []
    for r in results:
        eager, compiled = r["tokens_per_s"]["eager"], r["tokens_per_s"]["compiled"]
        saved_per_token = 1.0 / eager - 1.0 / compiled

        def break_even(first_s: float) -> str:
            """Tokens after which the compiled run has caught up with the eager one."""
            extra = first_s - r["eager_first_s"]
            return f"{extra / saved_per_token / 1e6:.1f}M" if saved_per_token > 0 else "never"

        rows.append([
            r["size"], f"{eager:,.0f}", f"{compiled:,.0f}", f"{r['ratio']:.3f}", f"{r['eager_first_s']:.1f}",
            f"{r['compiled_first_s']:.1f}", f"{r['compiled_warm_first_s']:.1f}", break_even(r["compiled_first_s"]),
            break_even(r["compiled_warm_first_s"]), f"{r['total_steps_tpp20'] * models.BATCH_TOKENS / 1e6:.1f}M",
        ])
    return markdown_table(
        ["size", "eager tok/s", "compiled tok/s", "compiled / eager", "first step eager (s)",
         "first step compiled, cold cache (s)", "… warm cache (s)", "break-even D (cold)", "break-even D (warm)",
         "D at TPP 20"],
        rows,
    )


def run_compile(sizes: list[str], threads: int, seconds: float) -> list[dict[str, Any]]:
    results = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache_dir:
            result = _in_process(measure_compile, size, threads, seconds, cache_dir)
            result["compiled_warm_first_s"] = _in_process(measure_warm_compile, size, threads, cache_dir)
        results.append(result)
        print(f"  compile {size} done: {json.dumps(result)}", flush=True)
    return results


# ---------------------------------------------------------------------- curves before/after
# The collapse ladder's defaults (benchmarks/collapse_ladder.py main()): the runs whose
# curves a trainer change must not move beyond float noise.
LADDER_DEFAULTS = {"widths": [64, 128, 192], "layers": 2, "d_head": 32, "seq_len": 64, "batch": 2048,
                   "tpp": 20.0, "lr": 1e-2, "tau": 0.3}
# (label, width, kind): kind "tau" = the fixed-τ ladder, "lambda" = the fixed-λ ladder
# (B doubled per rung), "seed1" = the seed-noise run of the smallest rung.
CURVE_RUNS = (("tau d=64", 64, "tau"), ("tau d=128", 128, "tau"), ("lambda d=128", 128, "lambda"),
              ("seed1 d=64", 64, "seed1"))


def _ladder_config(root: str, width: int, kind: str) -> dict[str, Any]:
    """One ladder config, built by the collapse-ladder code of ``root`` (so a base checkout
    builds exactly what its own ladder would)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("collapse_ladder", Path(root) / "benchmarks" / "collapse_ladder.py")
    ladder = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ladder)  # type: ignore[union-attr]
    from trainers.config import override, run_controls

    base = ladder.base_config(argparse.Namespace(**LADDER_DEFAULTS))
    fixed_tau = override(base, {"model.d_model": width})
    if kind == "tau":
        config = fixed_tau
    elif kind == "lambda":
        rung = LADDER_DEFAULTS["widths"].index(width)
        batch = int(round(LADDER_DEFAULTS["batch"] * 2.0**rung / LADDER_DEFAULTS["seq_len"])) * LADDER_DEFAULTS["seq_len"]
        weight_decay = run_controls(override(base, {"model.d_model": LADDER_DEFAULTS["widths"][0]})).weight_decay
        config = override(base, {"model.d_model": width, "batch_size": batch, "weight_decay": weight_decay})
    else:
        config = override(fixed_tau, {"seed": 1, "data.data_seed": 1})
    return ladder.with_log_every(config).model_dump()


def _curve_worker(job: tuple[str, str, int, str]) -> dict[str, Any]:
    """Run one ladder config to the end with the trainer of ``root``; return its curve."""
    root, label, width, kind = job
    sys.path.insert(0, root)  # before the first import of trainers in this (spawned) process
    import torch

    torch.set_num_threads(1)  # as the ladder runs them: one thread per run
    import trainers
    from trainers.train import Trainer

    assert Path(trainers.__file__).resolve().is_relative_to(Path(root).resolve()), trainers.__file__
    trainer = Trainer(_ladder_config(root, width, kind))
    start = time.perf_counter()
    history = trainer.run()
    return {
        "label": label,
        "trainers": trainers.__file__,
        "status": trainer.status,
        "seconds": time.perf_counter() - start,
        "steps": trainer.step,
        "train_loss": [r["train_loss"] for r in history],
        "smoothed_loss": [r["smoothed_loss"] for r in history],
    }


def record_curves(root: str, output: str, jobs: int = 2) -> None:
    """Train the CURVE_RUNS with the code in ``root`` and write their curves to ``output``."""
    work = [(str(Path(root).resolve()), label, width, kind) for label, width, kind in CURVE_RUNS]
    with mp.get_context("spawn").Pool(jobs) as pool:
        runs = pool.map(_curve_worker, work, chunksize=1)
    Path(output).write_text(json.dumps({"root": root, "runs": runs}) + "\n")
    for run in runs:
        print(f"{run['label']:>14}  {run['steps']:>5} steps  {run['seconds']:>6.0f} s  final {run['smoothed_loss'][-1]:.5f}")


def compare_curves(before_path: str, after_path: str) -> str:
    """Markdown table: max |Δ train_loss| over the logged points and |Δ final smoothed loss|."""
    from hpo.common.tables import markdown_table

    before = {r["label"]: r for r in json.loads(Path(before_path).read_text())["runs"]}
    after = {r["label"]: r for r in json.loads(Path(after_path).read_text())["runs"]}
    rows = []
    for label in before:
        a, b = before[label], after[label]
        assert len(a["train_loss"]) == len(b["train_loss"]), label
        delta = max(abs(x - y) for x, y in zip(a["train_loss"], b["train_loss"]))
        final = abs(a["smoothed_loss"][-1] - b["smoothed_loss"][-1])
        rows.append([label, a["steps"], f"{a['smoothed_loss'][-1]:.5f}", f"{b['smoothed_loss'][-1]:.5f}",
                     f"{delta:.1e}", f"{final:.1e}", f"{a['seconds']:.0f} → {b['seconds']:.0f}"])
    return markdown_table(["run", "steps", "final smoothed (before)", "final smoothed (after)",
                           "max |Δ train_loss|", "|Δ final smoothed|", "wall s, 1 thread (before → after)"], rows)


# ---------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {list(SIZES)}")
    parser.add_argument("--seconds", type=float, default=12.0, help="measured time per implementation and size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also time that checkout's trainer (implementation trainer@baseline), e.g. the commit before a change")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time rounds by thread CPU time instead of wall time (needs --threads 1; for loaded machines)")
    parser.add_argument("--quick", action="store_true", help="0.1M only, 3 s per implementation")
    parser.add_argument("--compile", action="store_true", help="measure torch.compile (eager vs compiled trainer)")
    parser.add_argument("--json", metavar="OUT.json", help="also write the raw measurements here")
    parser.add_argument("--curves", metavar="OUT.json", help="record the ladder curves (with --root's trainer)")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="checkout whose trainer --curves runs")
    parser.add_argument("--compare-curves", nargs=2, metavar=("BEFORE.json", "AFTER.json"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help=f"cuda: sizes {list(GPU_SIZES)}, trainer vs the plain GPT, bf16 (needs a CUDA GPU)")
    parser.add_argument("--compile-models", action="store_true",
                        help="with --device cuda: both the trainer and the plain GPT through torch.compile")
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda: torch sees no CUDA device on this machine", file=sys.stderr)
            sys.exit(2)
        sizes = args.sizes.split(",") if args.sizes != ",".join(SIZES) else list(GPU_SIZES)
        unknown = [s for s in sizes if s not in GPU_SIZES]
        if unknown:
            parser.error(f"--sizes: {unknown} are not GPU sizes {list(GPU_SIZES)}")
        implementations = tuple(args.implementations.split(",")) if args.implementations != ",".join(IMPLEMENTATIONS) \
            else GPU_IMPLEMENTATIONS
        print(f"cuda, bf16 autocast, {GPU_SEQUENCES} sequences/step, d_head 64, compiled: {args.compile_models}, "
              f"{args.seconds:g} s per implementation", flush=True)
        results = [_in_process(measure, size, args.threads, args.seconds, implementations, False, None, "cuda",
                               args.compile_models) for size in sizes]
        print(f"device: {results[0]['device']}; MFU = GFLOP/s over the measured bf16 matmul peak\n")
        print(throughput_tables(results).replace("of fp32 peak", "MFU").replace("fp32 matmul peak", "bf16 matmul peak"))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        return
    if args.cpu_clock and args.threads != 1:
        parser.error("--cpu-clock measures one thread's CPU time: use it with --threads 1")
    if args.curves:
        record_curves(args.root, args.curves)
        return
    if args.compare_curves:
        print(compare_curves(*args.compare_curves))
        return
    sizes = ["0.1M"] if args.quick else args.sizes.split(",")
    seconds = 3.0 if args.quick else args.seconds
    print(f"T {models.SEQ_LEN}, B {models.BATCH_TOKENS} tokens/step, d_head {models.D_HEAD}, fp32, {args.threads} threads, "
          f"{seconds:g} s per implementation; load average before: {os.getloadavg()[0]:.2f}", flush=True)
    if args.compile:
        results = run_compile(sizes, args.threads, seconds)
        print(compile_table(results))
    else:
        implementations = tuple(args.implementations.split(","))
        if args.baseline and "trainer@baseline" not in implementations:
            implementations = ("trainer@baseline", *implementations)
        results = []
        for size in sizes:
            results.append(_in_process(measure, size, args.threads, seconds, implementations, args.cpu_clock, args.baseline))
            print(f"  {size} done", flush=True)
        print(throughput_tables(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
