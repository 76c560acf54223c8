"""The Hugging Face Trainer callback (hpo.integrations.hf): the controls it derives from
TrainingArguments and the model, its errors, and a real sweep under CollapseScheduler."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from hpo.integrations.hf import CollapseReportCallback, hf_run_settings  # noqa: E402
from hpo.integrations.run_report import ReportSettingsError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 200


class State:
    max_steps = STEPS
    global_step = 0


def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def arguments(tmp_path: Path, **overrides) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, learning_rate=0.02, weight_decay=0.5, warmup_steps=0.1,
                    lr_scheduler_type="linear", logging_steps=5, report_to="none", use_cpu=True)
    return TrainingArguments(**{**settings, **overrides})


def test_the_controls_match_a_hand_computation(tmp_path) -> None:
    settings = hf_run_settings(arguments(tmp_path), State(), tiny_gpt2(), seq_len=64)
    controls = settings.controls()
    # B = 4 sequences x 2 accumulated x 1 process x 64 tokens; D = B x 200 steps.
    assert controls["batch_size"] == 512 and controls["total_tokens"] == 102_400
    # tau = B/(eta lambda D) = 1/(0.02 x 0.5 x 200).
    assert controls["tau"] == pytest.approx(0.5)
    # N by hand: per block 2 LayerNorms (2 x 64), c_attn 32x96+96, attn c_proj 32x32+32, c_fc
    # 32x128+128, mlp c_proj 128x32+32 = 12,704; 2 blocks + ln_f (64). Not wte/wpe, not the tied head.
    assert controls["n_params"] == 2 * (128 + 3168 + 1056 + 4224 + 4128) + 64 == 25_472
    assert controls["tokens_per_param"] == pytest.approx(102_400 / 25_472)
    assert (controls["schedule"], controls["warmup_fraction"], controls["eta"], controls["weight_decay"]) == (
        "linear", 0.1, 0.02, 0.5)
    report = settings.report(step=50, loss=3.0)
    assert (report["train_fraction"], report["tokens"], report["loss"]) == (0.25, 25_600, 3.0)


@pytest.mark.parametrize("kind, kwargs, expected", [
    ("linear", None, {"schedule": "linear", "warmup_fraction": 0.1}),
    ("cosine", None, {"schedule": "cosine", "warmup_fraction": 0.1}),
    ("constant", None, {"schedule": "constant", "warmup_fraction": 0.0}),  # HF's constant has no warmup
    ("constant_with_warmup", None, {"schedule": "constant", "warmup_fraction": 0.1}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}, {"schedule": "cosine", "warmup_fraction": 0.1, "final_fraction": 0.1}),
    ("cosine_with_min_lr", {"min_lr": 0.002}, {"schedule": "cosine", "warmup_fraction": 0.1, "final_fraction": 0.1}),
    ("warmup_stable_decay", {"num_decay_steps": 40, "decay_type": "1-sqrt"},
     {"schedule": "wsd", "warmup_fraction": 0.1, "decay_fraction": 0.2, "final_fraction": 0.0, "decay_shape": "sqrt"}),
    ("warmup_stable_decay", {"num_decay_steps": 50, "decay_type": "linear", "min_lr_ratio": 0.05},
     {"schedule": "wsd", "warmup_fraction": 0.1, "decay_fraction": 0.25, "final_fraction": 0.05, "decay_shape": "linear"}),
])
def test_each_hf_schedule_maps_to_the_predictors(tmp_path, kind, kwargs, expected) -> None:
    args = arguments(tmp_path, lr_scheduler_type=kind, lr_scheduler_kwargs=kwargs or {})
    keys = hf_run_settings(args, State(), tiny_gpt2(), seq_len=64).schedule.keys()
    for name in ("schedule", "decay_shape"):
        assert keys.pop(name, None) == expected.pop(name, None)
    assert keys == pytest.approx(expected)


@pytest.mark.parametrize("overrides, names", [
    ({"lr_scheduler_type": "polynomial"}, "TrainingArguments.lr_scheduler_type: 'polynomial'"),
    ({"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 40}},
     "lr_scheduler_kwargs.decay_type: 'cosine'"),
    ({"optim": "adafactor"}, "TrainingArguments.optim: 'adafactor'"),
    ({"logging_steps": 50}, "TrainingArguments.logging_steps: reports every 50 of 200 steps"),
    ({"learning_rate": 0.0}, "TrainingArguments.learning_rate"),
])
def test_a_value_that_cannot_be_derived_is_one_error_naming_it(tmp_path, overrides, names) -> None:
    with pytest.raises(ReportSettingsError, match=re.escape(names)):
        hf_run_settings(arguments(tmp_path, **overrides), State(), tiny_gpt2(), seq_len=64)


def test_the_sequence_length_is_read_from_the_training_set_or_asked_for(tmp_path) -> None:
    class Loader:
        def __init__(self, dataset):
            self.dataset = dataset

    blocks = Loader([{"input_ids": list(range(48))}])
    assert hf_run_settings(arguments(tmp_path), State(), tiny_gpt2(), train_dataloader=blocks).tokens_per_step == 384
    with pytest.raises(ReportSettingsError, match=r"seq_len: .*CollapseReportCallback\(seq_len=\.\.\.\)"):
        hf_run_settings(arguments(tmp_path), State(), tiny_gpt2(), train_dataloader=Loader([{"text": "x"}]))


def test_weight_decay_zero_reports_tau_infinite(tmp_path) -> None:
    assert math.isinf(hf_run_settings(arguments(tmp_path, weight_decay=0.0), State(), tiny_gpt2(),
                                      seq_len=64).controls()["tau"])


def test_the_callback_reports_each_logged_loss_with_the_training_fraction(tmp_path) -> None:
    got: list[dict] = []
    callback = CollapseReportCallback(seq_len=64, report=got.append)
    args, state = arguments(tmp_path), State()
    callback.on_train_begin(args, state, None, model=tiny_gpt2())
    state.global_step = 20
    callback.on_log(args, state, None, logs={"loss": 2.5, "learning_rate": 0.02})
    callback.on_log(args, state, None, logs={"eval_loss": 2.4})  # not a training loss: no report
    assert len(got) == 1 and got[0]["train_fraction"] == 0.1 and got[0]["loss"] == 2.5 and got[0]["tau"] == 0.5


@pytest.mark.slow  # a Ray sweep of 4 trials (~1 min): .ci/run runs it
def test_the_example_sweeps_a_tiny_gpt2_under_the_scheduler_and_decides_every_rung() -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "hf_trainer.py")], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    judged = dict(re.findall(r"rung (0\.[123]): (\d+) judged", done.stdout))
    # Async: every trial is judged at the first rung it reaches; every rung judged someone.
    assert judged.get("0.1") == "4" and all(int(judged.get(r, 0)) >= 1 for r in ("0.2", "0.3")), done.stdout
    assert len(re.findall(r"^lr=\S+: (stopped at|completed)", done.stdout, re.M)) == 4, done.stdout
