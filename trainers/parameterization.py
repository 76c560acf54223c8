"""µP / CompleteP / SP: init scales, forward multipliers and AdamW groups, by hand.

Every rule is relative to a base shape (base_d_model, base_n_layers, base_d_ff); at that
shape all three parameterizations are the same model with the same optimizer. The rules
(CompleteP, Dey et al. 2025, Table 1, depth exponent α = 1; µP = the same without depth
terms) and the reasons for our choices are in docs/parameterization.md.

    m = fan_in / base_fan_in   of each hidden matrix (the SwiGLU down-projection uses d_ff)
    m_N = d_model / base_d_model,   m_L = n_layers / base_n_layers

    group        init std   AdamW lr   AdamW weight decay   AdamW eps
    embedding    σ          η          λ                    ε/m_N
    hidden       σ/√m       η/m        λ·m                  ε/m_N · m_L^-α
    block norms  (ones)     η          0                    ε/m_N · m_L^-α
    final norm   (ones)     η          0                    ε/m_N
    lm_head      σ          η          λ                    ε/m_N

    forward: embedding × α_in;  logits × α_out/m_N;  residual branches × m_L^-α;
             attention logits × (1/√d_head_base)·(d_head_base/d_head)

SP keeps α_in and α_out (they are base hyperparameters) but no width or depth factor:
attention 1/√d_head, every lr η, every decay λ, every eps ε.

This module never imports torch: it maps parameter names to numbers, so the model, the
trainer and the config all read the same table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from trainers.config import ModelConfig

Role = Literal["embedding", "hidden", "block_norm", "final_norm", "unembedding"]

# Depth exponent α of CompleteP; µP mode has no depth rule (α = 0 and no LR depth factor).
COMPLETEP_ALPHA = 1.0


def parameter_role(name: str) -> Role:
    """Which row of the table a parameter belongs to; raises on a name it does not know."""
    if name == "embed.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "unembedding"
    if name == "final_norm.weight":
        return "final_norm"
    if name.startswith("blocks."):
        if name.endswith(("attn.qkv.weight", "attn.proj.weight", "mlp.gate_up.weight", "mlp.down.weight")):
            return "hidden"
        if name.endswith(("attn_norm.weight", "mlp_norm.weight")):
            return "block_norm"
    # Every parameter must land in exactly one group: an unknown name is a bug.
    raise ValueError(f"parameterization: no rule for parameter {name!r}")


def _depth_alpha(config: ModelConfig) -> float:
    return COMPLETEP_ALPHA if config.parameterization == "completep" else 0.0


def fan_in_multiplier(name: str, config: ModelConfig) -> float:
    """m = fan_in/base_fan_in of a hidden matrix (1 for everything else, and under SP)."""
    if config.parameterization == "sp" or parameter_role(name) != "hidden":
        return 1.0
    if name.endswith("mlp.down.weight"):
        return config.ffn_dim / config.base_ffn_dim
    # q, k, v, the attention output and gate/up all read a d_model-wide input.
    return config.d_model / config.base_d_model


def init_std(name: str, config: ModelConfig) -> float:
    """Std of the normal init; norms are ones and return 0 here (unused)."""
    role = parameter_role(name)
    if role in ("block_norm", "final_norm"):
        return 0.0
    if role == "hidden":
        return config.init_std / math.sqrt(fan_in_multiplier(name, config))
    return config.init_std


@dataclass(frozen=True)
class ForwardMultipliers:
    """Constants the forward pass multiplies by (1.0 means "skip the multiply")."""

    embedding: float  # α_in
    logits: float  # α_out/m_N applied to the final hidden state before lm_head
    residual: float  # m_L^-α on each attention / MLP branch
    attention_scale: float  # multiplies q·k


def forward_multipliers(config: ModelConfig) -> ForwardMultipliers:
    sp_attention = 1.0 / math.sqrt(config.head_dim)
    if config.parameterization == "sp":
        return ForwardMultipliers(config.alpha_in, config.alpha_out, 1.0, sp_attention)
    base_head = config.base_head_dim
    # 1/d_head relative to the base: the ratio is exactly 1.0 at the base head size, so
    # the scale is bit-identical to SP's 1/√d_head there (and with a fixed head size).
    attention = (1.0 / math.sqrt(base_head)) * (base_head / config.head_dim)
    residual = config.depth_multiplier ** -_depth_alpha(config)
    return ForwardMultipliers(
        embedding=config.alpha_in,
        logits=config.alpha_out / config.width_multiplier,
        residual=residual,
        attention_scale=attention,
    )


@dataclass(frozen=True)
class GroupSettings:
    """Peak AdamW settings of one parameter, before the schedule multiplier."""

    role: Role
    lr: float
    weight_decay: float
    eps: float


def optimizer_settings(
    name: str, config: ModelConfig, lr: float, weight_decay: float, eps: float
) -> GroupSettings:
    """Peak lr, decay and eps of a parameter, from the base values η, λ, ε."""
    role = parameter_role(name)
    if config.parameterization == "sp":
        decay = 0.0 if role in ("block_norm", "final_norm") else weight_decay
        return GroupSettings(role, lr, decay, eps)
    m = fan_in_multiplier(name, config)
    # Every gradient entry shrinks like 1/m_N under µP; block gradients also carry the
    # residual multiplier m_L^-α. ε follows so that it stays as small relative to √v.
    eps_scaled = eps / config.width_multiplier
    if role in ("hidden", "block_norm"):
        eps_scaled *= config.depth_multiplier ** -_depth_alpha(config)
    if role == "hidden":
        # λ·m with lr η/m: the product η·λ, hence τ, is the same for every decayed tensor.
        return GroupSettings(role, lr / m, weight_decay * m, eps_scaled)
    if role in ("embedding", "unembedding"):
        return GroupSettings(role, lr, weight_decay, eps_scaled)
    return GroupSettings(role, lr, 0.0, eps_scaled)


def param_groups(
    named_parameters: Iterable[tuple[str, Any]],
    config: ModelConfig,
    lr: float,
    weight_decay: float,
    eps: float,
) -> list[dict[str, Any]]:
    """AdamW parameter groups: parameters with identical settings share a group.

    Each group carries ``peak_lr`` (the trainer sets ``lr = peak_lr × schedule`` every
    step), ``weight_decay``, ``eps``, and ``role`` / ``names`` for inspection.
    """
    groups: dict[GroupSettings, dict[str, Any]] = {}
    for name, parameter in named_parameters:
        settings = optimizer_settings(name, config, lr, weight_decay, eps)
        group = groups.setdefault(
            settings,
            {
                "params": [],
                "names": [],
                "role": settings.role,
                "lr": settings.lr,
                "peak_lr": settings.lr,
                "weight_decay": settings.weight_decay,
                "eps": settings.eps,
            },
        )
        group["params"].append(parameter)
        group["names"].append(name)
    return list(groups.values())
