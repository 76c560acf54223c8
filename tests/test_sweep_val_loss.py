"""End to end: a sweep that decides on the validation loss (``scheduler.metric: val_loss``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpo.decisions.early_answer import early_answer_text
from hpo.decisions.scheduler_state import SchedulerState
from hpo.service.sweep import run_sweep
from hpo.trials.sweep_config import load_sweep_config
from sweep_fixtures import TINY_TRAINER

#: The predictor fitted on the validation loss (configs/calibration/val_loss.yaml).
VAL_LOSS_PREDICTOR = Path(__file__).resolve().parents[1] / "configs/predictors/val_loss.json"


def _val_loss_sweep(output: Path) -> dict:
    # 24K parameters at TPP 3: 69 steps, a report (and an evaluation of 8,192 held-out tokens)
    # every 5; eval_every is left out, so the sweep sets it to log_every.
    trainer = {k: v for k, v in TINY_TRAINER.items() if k != "eval_every"}
    trainer.update(model={**TINY_TRAINER["model"], "d_model": 32, "d_head": 16}, batch_size=1024, tokens_per_param=3)
    return {
        "name": "val", "output_dir": str(output), "trainer": trainer,
        "search_space": {"lr": {"grid": [0.0025, 0.04]}},
        "scheduler": {"mode": "sync", "rungs": [0.3], "reduction_factor": 2, "margin": 0.0, "metric": "val_loss"},
        "predictor": str(VAL_LOSS_PREDICTOR), "resources": {"cpu": 1}, "ray": {"num_cpus": 1},
        "mlflow": {"experiment": "val-test"}, "monitor": {"enabled": False},
    }


def test_a_val_loss_sweep_ranks_and_records_the_validation_loss(tmp_path: Path) -> None:
    import ray
    from mlflow.tracking import MlflowClient

    output = tmp_path / "out"
    config = load_sweep_config(data=_val_loss_sweep(output))
    assert config.base_trainer()["eval_every"] == 5  # every report evaluated
    try:
        outcome = run_sweep(config)
    finally:
        ray.shutdown()
    assert outcome["errors"] == []
    state = json.loads((output / "scheduler_state.json").read_text())
    assert state["settings"]["metric"] == "val_loss"
    (rung,) = state["rungs"]
    assert rung["decided"] and len(rung["survivors"]) == 1  # the last rung keeps the predicted best
    client = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("val-test")
    children = {r.data.tags["trial_id"]: r for r in client.search_runs([experiment.experiment_id])
                if "mlflow.parentRunId" in r.data.tags}
    assert len(children) == 2
    # The scheduler's curve of every trial is its logged val_loss, point for point, and not
    # its (smoothed) training loss.
    curves = {tid: rec.history for tid, rec in SchedulerState.load(output / "scheduler_state.json").trials.items()}
    for trial_id, run in children.items():
        val = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_loss"))
        train = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
        seen = [y for _, y in curves[trial_id]]
        assert len(val) == len(train) == len(seen) >= 4
        assert seen == pytest.approx([y for _, y in val], rel=1e-9)
        assert seen != pytest.approx([y for _, y in train], rel=1e-3)
        if run.data.tags["status"] == "completed":
            assert run.data.metrics["final_loss"] == pytest.approx(val[-1][1], rel=1e-9)
    answer = json.loads((output / "predicted_best.json").read_text())
    assert answer["metric"] == "val_loss"
    assert "predicted final validation loss" in early_answer_text(answer)
    assert "Decided on: `val_loss`" in (output / "report" / "report.md").read_text()

