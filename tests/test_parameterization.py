"""µP / CompleteP by hand: equality with SP at the base shape, width stability, the τ identity."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from trainers.config import DataConfig, ModelConfig, TrainConfig, run_controls
from trainers.data import TrainSampler, load_corpus
from trainers.model import GPT
from trainers.parameterization import (
    forward_multipliers,
    optimizer_settings,
    param_groups,
    parameter_role,
)
from trainers.train import Trainer

MODES = ("completep", "mup", "sp")


def _train_config(parameterization: str, **model: Any) -> dict[str, Any]:
    shape = {"d_model": 48, "n_layers": 3, "d_head": 16, "seq_len": 32, "base_d_model": 48, "base_n_layers": 3}
    shape.update(model, parameterization=parameterization, alpha_in=2.0, alpha_out=0.5)
    return {"model": shape, "batch_size": 256, "tau": 0.2, "lr": 0.02, "log_every": 3, "threads": 1}


def test_base_shape_models_equal_sp_exactly() -> None:
    configs = {mode: ModelConfig(**_train_config(mode)["model"]) for mode in MODES}
    models = {mode: GPT(config, generator=torch.Generator().manual_seed(3)) for mode, config in configs.items()}
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(4))
    reference = models["sp"](idx)
    for mode in ("completep", "mup"):
        # Same seed, base shape: identical weights and bit-identical logits to SP.
        for a, b in zip(models[mode].state_dict().values(), models["sp"].state_dict().values()):
            assert torch.equal(a, b)
        assert torch.equal(models[mode](idx), reference)


def test_base_shape_training_equals_sp_exactly() -> None:
    trainers = {mode: Trainer(_train_config(mode)) for mode in MODES}
    records = {mode: trainer.train_interval() for mode, trainer in trainers.items()}
    for mode in ("completep", "mup"):
        # Three AdamW steps later: the same losses and bit-identical weights as SP.
        assert records[mode]["train_loss"] == records["sp"]["train_loss"]
        for a, b in zip(trainers[mode].model.parameters(), trainers["sp"].model.parameters()):
            assert torch.equal(a, b)


def test_every_parameter_lands_in_exactly_one_group() -> None:
    config = ModelConfig(d_model=64, n_layers=2, d_head=16)
    model = GPT(config)
    groups = param_groups(model.named_parameters(), config, lr=1e-2, weight_decay=0.1, eps=1e-8)
    grouped = [id(p) for group in groups for p in group["params"]]
    # Each parameter appears once, and all of them appear.
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())
    # A name without a rule is an error, not a silent default.
    with pytest.raises(ValueError, match="blocks.0.attn.bias"):
        parameter_role("blocks.0.attn.bias")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("d_model", "n_layers"), [(64, 2), (128, 2), (256, 6), (96, 1)])
def test_tau_identity_for_every_decayed_group(mode: str, d_model: int, n_layers: int) -> None:
    config = TrainConfig.model_validate(
        {
            "model": {"d_model": d_model, "n_layers": n_layers, "d_head": 32, "seq_len": 64, "parameterization": mode},
            "batch_size": 4096,
            "tau": 0.37,
        }
    )
    controls = run_controls(config)
    model = GPT(config.model)
    groups = param_groups(model.named_parameters(), config.model, config.lr, controls.weight_decay, config.adam_eps)
    decayed = [g for g in groups if g["weight_decay"] > 0]
    target = controls.batch_size / (controls.tau * controls.total_tokens)
    # Every decayed group has peak lr·λ = B/(τ·D): one τ describes the whole run.
    assert {g["role"] for g in decayed} == {"embedding", "hidden", "unembedding"}
    for group in decayed:
        assert group["peak_lr"] * group["weight_decay"] == pytest.approx(target, rel=1e-12)
    # Norms are never decayed.
    assert all(g["weight_decay"] == 0 for g in groups if g["role"] in ("block_norm", "final_norm"))


def test_hidden_lr_uses_each_matrix_fan_in() -> None:
    # d_ff = 200 at d_model 128 (base 64, base d_ff 100): the down-projection's own ratio is 2.
    config = ModelConfig(d_model=128, base_d_model=64, n_layers=4, base_n_layers=2, d_ff=200, base_d_ff=100)
    down = optimizer_settings("blocks.0.mlp.down.weight", config, lr=1.0, weight_decay=1.0, eps=1.0)
    qkv = optimizer_settings("blocks.0.attn.qkv.weight", config, lr=1.0, weight_decay=1.0, eps=1.0)
    embed = optimizer_settings("embed.weight", config, lr=1.0, weight_decay=1.0, eps=1.0)
    norm = optimizer_settings("blocks.1.mlp_norm.weight", config, lr=1.0, weight_decay=1.0, eps=1.0)
    assert down.lr == 0.5 and down.weight_decay == 2.0
    assert qkv.lr == 0.5 and qkv.weight_decay == 2.0
    # ε/m_N everywhere, and ·1/m_L on block parameters (CompleteP, α = 1).
    assert qkv.eps == pytest.approx(1 / (2 * 2)) and norm.eps == pytest.approx(1 / (2 * 2))
    assert embed.eps == pytest.approx(1 / 2) and embed.lr == 1.0


def test_forward_multipliers_by_mode() -> None:
    shape = {"d_model": 256, "base_d_model": 64, "n_layers": 8, "base_n_layers": 2, "alpha_out": 2.0}
    completep = forward_multipliers(ModelConfig(**shape, d_head=32))
    mup = forward_multipliers(ModelConfig(**shape, d_head=32, parameterization="mup"))
    sp = forward_multipliers(ModelConfig(**shape, d_head=32, parameterization="sp"))
    # Logits × α_out/m_N, residual × 1/m_L (CompleteP only); SP keeps α_out and nothing else.
    assert completep.logits == 0.5 and completep.residual == 0.25
    assert mup.logits == 0.5 and mup.residual == 1.0
    assert sp.logits == 2.0 and sp.residual == 1.0
    # At a fixed head size the µP attention scale is SP's 1/√d_head exactly.
    assert completep.attention_scale == sp.attention_scale == 1 / math.sqrt(32)
    # With a fixed head count the head grows (16 → 64) and the scale falls like 1/d_head.
    heads = forward_multipliers(ModelConfig(**shape, n_heads=4))
    assert heads.attention_scale == pytest.approx((1 / math.sqrt(16)) * (16 / 64))


def _activation_rms(parameterization: str, width: int, batch: tuple[torch.Tensor, torch.Tensor], steps: int = 3) -> list[dict[str, float]]:
    """Per-layer output RMS after 1..steps AdamW steps on one fixed batch (lr 0.02, no decay)."""
    config = ModelConfig(
        d_model=width, n_layers=2, d_head=16, seq_len=32, base_d_model=32, base_n_layers=2, parameterization=parameterization
    )
    model = GPT(config, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(param_groups(model.named_parameters(), config, 0.02, 0.0, 1e-8), betas=(0.9, 0.95))
    stats: dict[str, float] = {}

    def record(name: str) -> Any:
        return lambda module, inputs, output: stats.__setitem__(name, output.pow(2).mean().sqrt().item())

    for i, block in enumerate(model.blocks):
        block.attn.register_forward_hook(record(f"attn{i}"))
        block.mlp.register_forward_hook(record(f"mlp{i}"))
        block.register_forward_hook(record(f"block{i}"))
    model.lm_head.register_forward_hook(record("logits"))
    history = []
    for step in range(steps + 1):
        loss = model(*batch)
        if step > 0:
            history.append(dict(stats))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return history


def _width_slopes(
    parameterization: str, widths: tuple[int, ...], batch: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, np.ndarray]:
    """Slope of log RMS against log width, per layer, at steps 1..3."""
    runs = [_activation_rms(parameterization, width, batch) for width in widths]
    slopes = {}
    for key in runs[0][0]:
        rms = np.array([[run[step][key] for step in range(3)] for run in runs])  # (width, step)
        slopes[key] = np.polyfit(np.log(widths), np.log(rms), 1)[0]
    return slopes


def test_coordinate_check_widths_stable_under_completep_and_growing_under_sp() -> None:
    corpus = load_corpus(DataConfig())
    batch = TrainSampler(corpus.tokens, 32, data_seed=1).sample(16)
    widths = (32, 64, 128, 256)
    completep = np.array(list(_width_slopes("completep", widths, batch).values()))
    sp = _width_slopes("sp", widths, batch)
    sp_hidden = np.array([value for key, value in sp.items() if key != "logits"])
    # µP/CompleteP: no layer's activation RMS grows with width at steps 1-3 (log-log slope < 0.4),
    # and none shrinks faster than the init contribution fading like 1/√width (slope > −0.5).
    assert completep.max() < 0.4 and completep.min() > -0.5, completep
    # SP with the same LR: every hidden activation grows with width, on average faster than
    # ∝ width (SP logits grow too until the softmax saturates, so they are not bounded here).
    assert sp_hidden.min() > 0.4 and sp_hidden.mean() > 1.0, sp
    assert sp["logits"][0] > 0.4, sp
