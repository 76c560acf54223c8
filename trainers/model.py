"""A byte-level GPT: pre-norm decoder, ALiBi attention, SwiGLU MLP, no biases.

Shape and parameterization come from `ModelConfig`; every width/depth-dependent number
(init std, attention scale, residual and logit multipliers) comes from
trainers/parameterization.py, so SP, µP and CompleteP share this one forward pass.

* Norm: RMSNorm with a learned gain and no bias (cheaper than LayerNorm; nothing to decay).
* Positions: ALiBi, a fixed per-head linear distance penalty added to the attention logits;
  no position embedding, so the model has no width-dependent position parameters.
* Vocabulary: 256 bytes; token embedding and lm_head are separate (untied) matrices.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainers.config import ModelConfig
from trainers.parameterization import forward_multipliers, init_std, parameter_role

VOCAB_SIZE = 256


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes 2^(-8i/n), i = 1..n (Press et al. 2022), for any head count.

    For a power of two this is the paper's geometric series; otherwise the series of the
    next smaller power of two is completed with every other slope of the next larger one.
    """

    def power_of_two_slopes(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two_slopes(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, seq_len: int) -> torch.Tensor:
    """Additive attention bias (n_heads, T, T): −slope·(i−j) for j ≤ i, −inf above the diagonal."""
    position = torch.arange(seq_len)
    distance = (position[:, None] - position[None, :]).float()  # i − j
    bias = -alibi_slopes(n_heads)[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias)·v over (B, H, T, hs) tensors.

    On CUDA this is ``F.scaled_dot_product_attention`` (fused kernels, no stored T×T
    matrix). On CPU, where SDPA with an additive mask runs its unfused math path plus
    masking checks, the plain three-op version measured 2-6% faster per training step
    (0.1M-1M parameters, T = 128, torch 2.13), so the CPU uses it. Both compute the same
    function (tested).
    """
    if q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    scores = torch.matmul(q * scale, k.transpose(-2, -1)) + bias
    return torch.matmul(scores.softmax(dim=-1), v)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, scale: float) -> None:
        super().__init__()
        self.n_heads = config.num_heads
        self.d_head = config.head_dim
        self.scale = scale
        inner = self.n_heads * self.d_head
        self.qkv = nn.Linear(config.d_model, 3 * inner, bias=False)
        self.proj = nn.Linear(inner, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # (B, T, 3·H·hs) -> three (B, H, T, hs)
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        y = attend(q, k, v, bias, self.scale)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.d_head))


class SwiGLU(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.d_ff = config.ffn_dim
        # gate and up projections fused into one matrix: one GEMM instead of two.
        self.gate_up = nn.Linear(config.d_model, 2 * self.d_ff, bias=False)
        self.down = nn.Linear(self.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, attention_scale: float, residual: float) -> None:
        super().__init__()
        self.residual = residual
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config, attention_scale)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.residual == 1.0:  # µP / SP: skip a multiply per branch
            x = x + self.attn(self.attn_norm(x), bias)
            return x + self.mlp(self.mlp_norm(x))
        ### CompleteP: residual branches × m_L^-α ###
        x = x + self.residual * self.attn(self.attn_norm(x), bias)
        return x + self.residual * self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Decoder-only byte-level transformer; ``forward(idx, targets)`` returns logits or loss."""

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        self.multipliers = forward_multipliers(config)
        self.embed = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.blocks = nn.ModuleList(
            Block(config, self.multipliers.attention_scale, self.multipliers.residual)
            for _ in range(config.n_layers)
        )
        self.final_norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)
        # Not a parameter and not saved: rebuilt from the config.
        self.register_buffer("alibi", alibi_bias(config.num_heads, config.seq_len), persistent=False)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal init with the per-parameter std of the parameterization; norms to ones."""
        for name, parameter in self.named_parameters():
            std = init_std(name, self.config)
            if std == 0.0:
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, std, generator=generator)

    def n_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default N, which excludes the embedding and lm_head."""
        return sum(
            p.numel()
            for name, p in self.named_parameters()
            if not non_embedding or parameter_role(name) not in ("embedding", "unembedding")
        )

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden state (B, T, d), before the logit multiplier."""
        seq = idx.shape[1]
        x = self.embed(idx)
        if self.multipliers.embedding != 1.0:
            x = x * self.multipliers.embedding
        bias = self.alibi[:, :seq, :seq]
        for block in self.blocks:
            x = block(x, bias)
        return self.final_norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden_states(idx)
        ### µP: logits × α_out/m_N ###
        if self.multipliers.logits != 1.0:
            h = h * self.multipliers.logits
        logits = self.lm_head(h)
        if targets is None:
            return logits
        # Loss in fp32 even under bf16 autocast.
        return F.cross_entropy(logits.float().view(-1, VOCAB_SIZE), targets.reshape(-1))
