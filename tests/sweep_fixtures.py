"""A tiny sweep config shared by the end-to-end sweep tests (seconds per trial on one core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_TRAINER: dict[str, Any] = {
    "model": {"d_model": 64, "n_layers": 2, "d_head": 32, "seq_len": 64,
              "base_d_model": 64, "base_n_layers": 2},
    "data": {"corpus": "stdlib", "data_seed": 0},
    "tokens_per_param": 4,
    "batch_size": 2048,
    "tau": 0.3,
    "schedule": "linear",
    "warmup_fraction": 0.1,
    "seed": 0,
    "log_every": 5,
    "eval_every": 100,
    "eval_tokens": 8192,
    "threads": 1,
}


def tiny_sweep(output_dir: Path, **scheduler: Any) -> dict[str, Any]:
    """Four LRs at fixed τ, rungs at 0.2 and 0.4, halving. Margin 0 (not the calibrated
    default) so that the survivors of these pipeline tests are exactly ⌈n/2⌉, then one."""
    scheduler = {"margin": 0.0, **scheduler}
    return {
        "name": "tiny",
        "output_dir": str(output_dir),
        "trainer": dict(TINY_TRAINER),
        "search_space": {"lr": {"grid": [0.0025, 0.01, 0.04, 0.16]}},
        "scheduler": {"mode": "sync", "rungs": [0.2, 0.4], "reduction_factor": 2, **scheduler},
        "resources": {"cpu": 1},
        "ray": {"num_cpus": 2},
        "mlflow": {"experiment": "tiny-test"},
    }
