"""The training loop and runner: learning, exact resume, divergence, output files."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainers.config import DataConfig, load_train_config
from trainers.data import load_corpus, split_corpus
from trainers.runner import CURVE_COLUMNS, run_to_directory
from trainers.train import COMPILE_MIN_TOKENS, Trainer, optimizer_kind, resolve_compile, resolve_device

NO_CUDA = "CUDA is not available on this machine (CPU-only torch build or no GPU); the CUDA path is untested here"

def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy of the byte distribution, in nats per byte: the loss of the best unigram model."""
    counts = np.bincount(np.asarray(tokens, dtype=np.uint8).ravel(), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


RECORD_KEYS = {"step", "tokens", "train_fraction", "train_loss", "smoothed_loss", "val_loss", "lr", "elapsed_s", "diverged"}


def _config(**updates: Any) -> dict[str, Any]:
    """A ~24k-parameter model on 32-byte windows; tokens_per_param sets the length."""
    data: dict[str, Any] = {
        "model": {"d_model": 32, "n_layers": 2, "d_head": 16, "seq_len": 32, "base_d_model": 32},
        "batch_size": 512,
        "tokens_per_param": 0.5,
        "lr": 0.02,
        "tau": 0.3,
        "log_every": 4,
        "eval_every": 8,
        "eval_tokens": 2048,
        "smoothing_tokens": 4096,
        "threads": 1,
    }
    data.update(updates)
    return data


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_tiny_run_learns_below_unigram_entropy() -> None:
    trainer = Trainer(_config(tokens_per_param=4.0, batch_size=1024, log_every=20, eval_every=None))
    history = trainer.run()
    train, val = split_corpus(load_corpus(DataConfig()).tokens, 0.1)
    # ~90 steps take a 24k-parameter model below the best unigram (byte-frequency) model,
    # on training and on held-out bytes.
    assert trainer.status == "completed" and trainer.step == trainer.total_steps
    assert history[-1]["smoothed_loss"] < unigram_entropy(train)
    assert history[-1]["val_loss"] < unigram_entropy(val)


def test_records_have_the_contract_keys_and_schedule() -> None:
    trainer = Trainer(_config())
    records = trainer.run()
    # Every record has the logged keys; steps advance by log_every; the last is the end.
    assert all(set(r) == RECORD_KEYS for r in records)
    assert [r["step"] for r in records][:3] == [4, 8, 12] and records[-1]["train_fraction"] == 1.0
    assert records[-1]["tokens"] == trainer.controls.total_tokens
    # Validation runs at multiples of eval_every and at the end; NaN elsewhere.
    assert not math.isnan(records[1]["val_loss"]) and math.isnan(records[0]["val_loss"])
    assert not math.isnan(records[-1]["val_loss"])
    # The logged LR is the hidden matrices' scheduled LR: it warms up, then decays towards 0.
    peak = max(r["lr"] for r in records)
    assert peak <= trainer.controls.eta_hidden and records[-1]["lr"] < 0.1 * peak


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    uninterrupted = Trainer(_config()).run()
    first = Trainer(_config())
    first.train_interval()
    first.train_interval()
    first.save_checkpoint(tmp_path)
    resumed = Trainer(_config())
    resumed.load_checkpoint(tmp_path)
    records = resumed.run()
    # Saved at step 8 and resumed in a new Trainer: every loss and LR equals the uninterrupted run's.
    assert len(records) == len(uninterrupted)
    for a, b in zip(records, uninterrupted):
        for key in ("step", "train_loss", "smoothed_loss", "val_loss", "lr"):
            assert _same(a[key], b[key]), (key, a, b)


def test_checkpoint_of_another_config_is_refused(tmp_path: Path) -> None:
    trainer = Trainer(_config())
    trainer.train_interval()
    trainer.save_checkpoint(tmp_path)
    # Resuming under a different config is an error naming the differing field.
    with pytest.raises(ValueError, match="lr"):
        Trainer(_config(lr=0.01)).load_checkpoint(tmp_path)


def test_gradient_accumulation_matches_one_big_batch() -> None:
    whole = Trainer(_config())
    split = Trainer(_config(micro_batch_size=128))
    a, b = whole.train_interval(), split.train_interval()
    # Four micro-batches of 128 tokens see the same data and give the same step (up to rounding).
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    for p, q in zip(whole.model.parameters(), split.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_data_order_depends_on_data_seed_not_init_seed() -> None:
    # Two init seeds with one data seed draw the same windows; the data seed changes them.
    samples = [Trainer(_config(seed=s, data={"data_seed": d})).sampler.sample(2)[0] for s, d in ((0, 0), (1, 0), (0, 1))]
    assert torch.equal(samples[0], samples[1]) and not torch.equal(samples[0], samples[2])


def test_huge_lr_ends_as_diverged_without_exception() -> None:
    trainer = Trainer(_config(lr=100.0))
    records = trainer.run()
    # The run stops early with status "diverged" and a record flagged diverged.
    assert trainer.status == "diverged" and trainer.done
    assert records[-1]["diverged"] and trainer.step < trainer.total_steps


def test_nan_loss_ends_as_diverged() -> None:
    trainer = Trainer(_config())
    with torch.no_grad():
        trainer.model.lm_head.weight[0, 0] = float("nan")
    record = trainer.train_interval()
    # A non-finite loss is divergence too.
    assert record["diverged"] and trainer.status == "diverged"
    with pytest.raises(RuntimeError, match="diverged"):
        trainer.train_interval()


def test_run_to_directory_writes_the_three_files(tmp_path: Path) -> None:
    output = tmp_path / "run"
    summary = run_to_directory(_config(), output, progress=False)
    # config.yaml round-trips, curve.csv has the contract columns, controls.json the run facts.
    assert load_train_config(output / "config.yaml") == load_train_config(_config())
    with open(output / "curve.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CURVE_COLUMNS and float(rows[-1]["train_fraction"]) == 1.0
    controls = json.loads((output / "controls.json").read_text())
    assert controls["tau"] == pytest.approx(summary["tau"]) and controls["n_params"] == summary["n_params"]
    for key in ("tau", "weight_decay", "tokens_per_param", "n_params", "total_tokens", "batch_size", "lr",
                "schedule", "seed", "data_seed", "corpus_hash", "python_version", "torch_version",
                "numpy_version", "status", "final_val_loss", "device", "device_name", "compiled", "optimizer"):
        assert key in controls, key
    assert controls["status"] == "completed"
    # device "auto" resolves to the device the run used, which is what controls.json records.
    assert controls["device"] == str(resolve_device("auto")) and controls["compiled"] is False


def test_invalid_config_creates_no_directory(tmp_path: Path) -> None:
    output = tmp_path / "never"
    # Validation fails before anything is written.
    with pytest.raises(ValueError):
        run_to_directory(_config(lr=-1.0), output, progress=False)
    assert not output.exists()


def test_cpu_run_uses_fused_adamw_and_fp32() -> None:
    trainer = Trainer(_config(device="cpu"))
    # The fused AdamW kernel runs on CPU (torch >= 2.4); fp32, no TF32, no compile for a short run.
    assert optimizer_kind(trainer.optimizer) == "fused"
    assert trainer.autocast_dtype is None and not trainer.tf32 and not trainer.compiled


def test_compile_auto_only_where_measured_faster() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    # "auto": eager for short CPU runs (compiling would cost more than it saves) and on CUDA
    # (unmeasured); compiled for long CPU runs where a C++ compiler is installed.
    assert resolve_compile("auto", cpu, COMPILE_MIN_TOKENS - 1) is False
    assert resolve_compile("auto", cuda, 10 * COMPILE_MIN_TOKENS) is False
    assert resolve_compile("auto", cpu, COMPILE_MIN_TOKENS) is bool(shutil.which("g++") or shutil.which("c++"))
    # An explicit setting wins.
    assert resolve_compile(True, cpu, 1) is True and resolve_compile(False, cpu, 10 * COMPILE_MIN_TOKENS) is False
    # The test-sized runs of this suite stay eager.
    assert not Trainer(_config()).compiled


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available, so device 'cuda' is valid here")
def test_cuda_requested_without_cuda_is_an_error() -> None:
    # Asking for CUDA where there is none fails loudly instead of silently training on CPU.
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Trainer(_config(device="cuda"))


@pytest.mark.slow
def test_compiled_run_matches_eager_and_resumes(tmp_path: Path) -> None:
    # Slow: inductor takes ~1-2 minutes to compile even this tiny model on 2 CPU cores.
    eager = Trainer(_config()).run()
    compiled = Trainer(_config(compile=True))
    assert compiled.compiled
    records = compiled.run()
    # The compiled step fuses ops (other rounding), so losses agree to float noise only.
    for a, b in zip(records, eager):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    first = Trainer(_config(compile=True))
    first.train_interval()
    first.save_checkpoint(tmp_path)
    resumed = Trainer(_config(compile=True))
    resumed.load_checkpoint(tmp_path)
    # Resuming a compiled run reproduces the uninterrupted compiled run exactly.
    assert [r["train_loss"] for r in resumed.run()] == [r["train_loss"] for r in records]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_run_is_bf16_tf32_and_never_waits_for_the_device() -> None:
    trainer = Trainer(_config(device="cuda"))
    # dtype "auto" on CUDA: bf16 autocast, TF32 for fp32 matmuls, fused AdamW.
    assert trainer.autocast_dtype == torch.bfloat16 and trainer.tf32
    assert torch.get_float32_matmul_precision() == "high" and optimizer_kind(trainer.optimizer) == "fused"
    trainer.train_interval()  # warm-up: first-use allocations and cuBLAS/SDPA setup may sync
    torch.cuda.synchronize()
    # Within an interval the steps never wait for the device (sync debug mode raises on a sync).
    torch.cuda.set_sync_debug_mode("error")
    try:
        for slot in range(trainer.config.log_every):
            trainer._train_step(slot)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    record = trainer.train_interval()
    assert math.isfinite(record["train_loss"]) and record["train_loss"] < math.log(256)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_and_cpu_start_from_the_same_weights_and_data() -> None:
    cpu, cuda = Trainer(_config(device="cpu", dtype="float32")), Trainer(_config(device="cuda", dtype="float32"))
    # Init and data order come from CPU generators: the same on every device.
    for a, b in zip(cpu.model.parameters(), cuda.model.parameters()):
        assert torch.equal(a, b.cpu())
    assert torch.equal(cpu.sampler.sample(4)[0], cuda.sampler.sample(4)[0])
    # fp32 (no TF32): the first interval's loss agrees to float tolerance.
    assert cpu.train_interval()["train_loss"] == pytest.approx(cuda.train_interval()["train_loss"], rel=1e-4)
