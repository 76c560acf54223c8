"""Run one training config into an output directory (what `hpo train` calls).

Writes, in ``output_dir``:

* ``config.yaml``   the resolved config (every default written out);
* ``curve.csv``     step, tokens, train_fraction, train_loss, smoothed_loss, val_loss, lr,
                    appended and flushed per log record, so a crashed run keeps its curve;
* ``controls.json`` τ, λ, TPP, N, D, B, η, schedule, seeds, corpus hash, versions, status
                    and final losses; written at the start (status "running") and again
                    at the end.
"""

from __future__ import annotations

import csv
import math
import platform
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from predictors import run_keys
from predictors.io import atomic_write_json, atomic_write_text
from trainers.config import TrainConfig, load_train_config
from trainers.train import Trainer, optimizer_kind

CURVE_COLUMNS = run_keys.names(point=True)  # the table: predictors.run_keys


def _last_finite(history: list[dict[str, Any]], key: str) -> float:
    for record in reversed(history):
        if math.isfinite(record[key]):
            return float(record[key])
    return float("nan")


def _device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model (Linux /proc/cpuinfo), else the architecture."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def describe_run(trainer: Trainer) -> dict[str, Any]:
    """The controls.json content: controls, provenance, status and final losses."""
    history = trainer.history
    return {
        **trainer.controls.to_dict(),
        **trainer.corpus.describe(),
        # Passes over the training tokens; above 1 the run repeated data.
        "epochs": trainer.epochs,
        "status": trainer.status,
        "steps_done": trainer.step,
        "final_train_loss": history[-1]["train_loss"] if history else float("nan"),
        "final_smoothed_loss": history[-1]["smoothed_loss"] if history else float("nan"),
        "final_val_loss": _last_finite(history, "val_loss"),
        "elapsed_s": trainer.elapsed_s,
        # Where and how the steps ran (config.yaml holds what was asked for, e.g. "auto").
        "device": str(trainer.device),
        "device_name": _device_name(trainer.device),
        "autocast_dtype": str(trainer.autocast_dtype) if trainer.autocast_dtype else "float32",
        "tf32": trainer.tf32,
        "compiled": trainer.compiled,
        "optimizer": optimizer_kind(trainer.optimizer),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "platform": platform.platform(),
    }


def run_to_directory(
    config: TrainConfig | Mapping[str, Any] | str | Path, output_dir: str | Path, progress: bool = True
) -> dict[str, Any]:
    """Train ``config`` to completion, writing config.yaml, curve.csv and controls.json.

    The config is validated before anything is created on disk. Returns the
    controls.json content.
    """
    config = load_train_config(config)
    trainer = Trainer(config)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    # Strict JSON: a NaN final loss (a run that diverged at once) is written as null.
    atomic_write_json(output_dir / "controls.json", describe_run(trainer))

    with open(output_dir / "curve.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CURVE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        with Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not progress,
            transient=False,
        ) as bar:
            task = bar.add_task("train", total=trainer.total_steps, loss="-")

            def on_record(record: dict[str, Any]) -> None:
                writer.writerow(record)
                handle.flush()
                bar.update(task, completed=record["step"], loss=f"{record['smoothed_loss']:.4f}")

            trainer.run(on_record)

    summary = describe_run(trainer)
    atomic_write_json(output_dir / "controls.json", summary)
    return summary
