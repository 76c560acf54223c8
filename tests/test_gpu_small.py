"""The packaged GPU sweep: it validates, its trials are the ~25M model at T 1024 in bf16 on a
quarter GPU each, and on a machine without CUDA it stops with one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpo.service.cli import main
from hpo.data import sweep_config_path
from hpo.trials.sweep_config import load_sweep_config
from trainers.config import TrainConfig, run_controls


def test_gpu_small_is_a_five_trial_lr_sweep_of_a_25m_model() -> None:
    config = load_sweep_config(sweep_config_path("gpu-small"))
    assert list(config.search_space) == ["lr"] and len(config.search_space["lr"].grid) == 5
    assert config.resources.gpu == 0.25
    trial = TrainConfig.model_validate(config.trial_trainer({"lr": 0.01}))
    controls = run_controls(trial)
    assert 20e6 < controls.n_params < 30e6 and controls.seq_len == 1024 and trial.tau is not None
    assert trial.dtype == "bfloat16" and trial.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: gpu-small would start")
def test_gpu_small_without_cuda_fails_in_one_line(tmp_path: Path, capsys: Any) -> None:
    output = tmp_path / "out"
    assert main(["sweep", "gpu-small", "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resources.gpu: 0.25 needs a CUDA GPU" in err[0]
    assert not output.exists()
