"""The Lightning callback (hpo.integrations.lightning): the controls it derives from the
trainer, the optimizer and a batch, its errors, and a real sweep under CollapseScheduler."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402

from hpo.integrations.lightning import CollapseReportCallback, lightning_run_settings, torch_schedule  # noqa: E402
from hpo.integrations.run_report import ReportSettingsError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS, LR = 100, 0.01


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.block = torch.nn.Linear(16, 16)  # 16 x 16 + 16 = 272 non-embedding parameters
        self.lm_head = torch.nn.Linear(16, 64, bias=False)


def optimizer(model: torch.nn.Module, **kwargs) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return kwargs.pop("cls", torch.optim.AdamW)(
        [{"params": decay, "weight_decay": 0.5}, {"params": rest, "weight_decay": 0.0}], lr=LR, **kwargs)


def trainer(opt, scheduler=None, **overrides) -> SimpleNamespace:
    configs = [SimpleNamespace(scheduler=scheduler, interval="step", frequency=1)] if scheduler else []
    return SimpleNamespace(**{"max_steps": STEPS, "estimated_stepping_batches": STEPS, "optimizers": [opt],
                              "lr_scheduler_configs": configs, **overrides})


def test_the_controls_match_a_hand_computation() -> None:
    model = TinyLM()
    opt = optimizer(model)
    warm = torch.optim.lr_scheduler.LinearLR(opt, 0.01, 1.0, total_iters=10)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=90, eta_min=0.001)
    schedule = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[10])
    controls = lightning_run_settings(trainer(opt, schedule), model, tokens_per_step=1024).controls()
    # tau = 1/(eta lambda S) with lambda the decayed group's 0.5; TPP = 1024 x 100 / 272.
    assert controls["tau"] == pytest.approx(1 / (LR * 0.5 * STEPS))
    assert controls["n_params"] == 272 and controls["tokens_per_param"] == pytest.approx(102_400 / 272)
    assert (controls["schedule"], controls["warmup_fraction"], controls["final_fraction"]) == ("cosine", 0.1,
                                                                                               pytest.approx(0.1))


@pytest.mark.parametrize("make, expected", [
    (lambda o: None, ("constant", 0.0, None)),
    (lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.0, total_iters=STEPS), ("linear", 0.0, None)),
    (lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.1, total_iters=STEPS), ("linear_10x", 0.0, None)),
    (lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=5), ("constant", 0.05, None)),
    (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS), ("cosine", 0.0, None)),
    (lambda o: torch.optim.lr_scheduler.SequentialLR(o, [torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=20),
                                                         torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.0, total_iters=80)],
                                                     milestones=[20]), ("linear", 0.2, None)),
])
def test_each_known_torch_scheduler_maps_to_the_predictors(make, expected) -> None:
    opt = optimizer(TinyLM())
    got = torch_schedule(make(opt), STEPS, LR)
    assert (got.name, got.warmup_fraction, got.final_fraction) == pytest.approx(expected)


@pytest.mark.parametrize("build, names", [
    (lambda o: trainer(o, torch.optim.lr_scheduler.StepLR(o, 10)), "lr_scheduler: StepLR"),
    (lambda o: trainer(o, torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50)), "CosineAnnealingLR.T_max: 50"),
    (lambda o: trainer(o, max_steps=-1, estimated_stepping_batches=float("inf")), "trainer.max_steps"),
])
def test_a_value_that_cannot_be_derived_is_one_error_naming_it(build, names) -> None:
    model = TinyLM()
    with pytest.raises(ReportSettingsError, match=re.escape(names)):
        lightning_run_settings(build(optimizer(model)), model, tokens_per_step=1024)


def test_an_optimizer_other_than_adamw_is_refused_by_name() -> None:
    model = TinyLM()
    with pytest.raises(ReportSettingsError, match="optimizer: Adam is not AdamW"):
        lightning_run_settings(trainer(optimizer(model, cls=torch.optim.Adam)), model, tokens_per_step=1024)


def test_the_callback_counts_batch_tokens_and_reports_the_mean_loss_of_each_interval() -> None:
    got: list[dict] = []
    model = TinyLM()
    fake = trainer(optimizer(model), accumulate_grad_batches=2, world_size=1, log_every_n_steps=2, global_step=0)
    callback = CollapseReportCallback(report=got.append)
    batch = (torch.zeros(4, 32, dtype=torch.long),)
    for step, loss in enumerate((4.0, 3.0, 2.0), start=1):
        fake.global_step = step
        callback.on_train_batch_end(fake, model, {"loss": torch.tensor(loss)}, batch, step - 1)
    assert callback.settings.tokens_per_step == 4 * 32 * 2
    assert [(r["step"], r["loss"], r["train_fraction"]) for r in got] == [(2, 3.5, 0.02)]


@pytest.mark.slow  # a Ray sweep of 4 trials (~1 min): .ci/run runs it
def test_the_example_sweeps_a_tiny_model_under_the_scheduler_and_decides_every_rung() -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "lightning_trainer.py")], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    judged = dict(re.findall(r"rung (0\.[123]): (\d+) judged", done.stdout))
    assert judged.get("0.1") == "4" and all(int(judged.get(r, 0)) >= 1 for r in ("0.2", "0.3")), done.stdout
    assert len(re.findall(r"^lr=\S+: (stopped at|completed)", done.stdout, re.M)) == 4, done.stdout
