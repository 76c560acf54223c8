"""A byte-level GPT: pre-norm decoder, ALiBi attention, SwiGLU MLP, no biases.

Shape and parameterization come from `ModelConfig`; every width/depth-dependent number
(init std, attention scale, residual and logit multipliers) comes from
trainers/parameterization.py, so SP, µP and CompleteP share this one forward pass.

* Norm: RMSNorm with a learned gain and no bias (cheaper than LayerNorm; nothing to decay).
* Positions: ALiBi, a fixed per-head linear distance penalty added to the attention logits;
  no position embedding, so the model has no width-dependent position parameters.
* Vocabulary: V = ``model.vocab_size`` (256 bytes by default, a tokenizer's V on a token
  dataset); token embedding and lm_head are separate (untied) V × d matrices. Under µP V is
  a fixed ("finite") dimension: only d grows, so the embedding keeps η, σ and α_in and the
  logits keep α_out/m_N whatever V is (docs/parameterization.md).

Speed (benchmarks/trainer_throughput.md): on CUDA attention is FlexAttention with ALiBi as
a ``score_mod`` and a causal ``BlockMask`` (``flex_alibi``: no T×T bias tensor, masked blocks
skipped); on CPU it is ``F.scaled_dot_product_attention`` with the ALiBi bias as a float mask
(FlexAttention has no CPU backward in torch 2.13, and its compiled CPU forward measured
slower: benchmarks/attention_cpu.py); every µP/CompleteP multiplier and every
RMSNorm gain is folded into the weight of the matmul it scales (ScaledLinear), so none costs
an activation-sized op; on CPU the norm has a closed-form backward (_UnitRMSNormCPU).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainers.config import ModelConfig
from trainers.parameterization import forward_multipliers, init_std, parameter_role

#: The byte vocabulary, ``model.vocab_size``'s default.
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
    """softmax(q·kᵀ·scale + bias)·v over (B, H, T, hs) tensors, on every device.

    ``F.scaled_dot_product_attention`` with the ALiBi bias as a float ``attn_mask``: fused
    kernels on CUDA and on CPU (flash attention, no stored T×T matrix in the backward).
    ``bias`` must be 4-D, (1, H, T, T): with a 3-D (H, T, T) mask torch 2.13's CPU dispatch
    falls back to the unfused math path. It must have q's dtype (the model keeps a cast copy
    for autocast). A test checks it against the three-op softmax(q·kᵀ·scale + bias)·v.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


AttentionBackend = Literal["auto", "sdpa", "flex"]


def flex_attention_available() -> bool:
    """Whether this torch has FlexAttention (torch >= 2.5)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


# One causal BlockMask per (T, device), built on first use: it depends on nothing else (the
# ALiBi slopes live in the score_mod), so every layer, step and model of that T shares it.
_BLOCK_MASKS: dict[tuple[int, torch.device], Any] = {}
# flex_attention compiled once; dynamic=False makes it specialise (compile once) per shape.
_COMPILED_FLEX: list[Any] = []


def _causal(batch: Any, head: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


@torch.compiler.disable
def causal_block_mask(seq_len: int, device: torch.device) -> Any:
    """The causal ``BlockMask`` for length ``seq_len`` on ``device`` (cached)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (seq_len, torch.device(device))
    if key not in _BLOCK_MASKS:
        _BLOCK_MASKS[key] = create_block_mask(_causal, None, None, seq_len, seq_len, device=device)
    return _BLOCK_MASKS[key]


def _flex_kernel(compiled: bool) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if not _COMPILED_FLEX:
        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


# id(slopes) -> (a weak reference to the slopes tensor, its score_mod). Tensors cannot key a
# WeakKeyDictionary (their == is elementwise), so the entry checks that the id is still theirs.
_SCORE_MODS: dict[int, tuple[Any, Any]] = {}


def alibi_score_mod(slopes: torch.Tensor) -> Any:
    """The ALiBi ``score_mod`` of a slopes tensor: score − slope_h·(i−j). One function object
    per slopes tensor (a model's buffer), so the compiled kernel sees the same one every call."""
    entry = _SCORE_MODS.get(id(slopes))
    if entry is None or entry[0]() is not slopes:

        def alibi(score: torch.Tensor, batch: Any, head: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return score - slopes[head] * (q_idx - kv_idx)

        entry = _SCORE_MODS[id(slopes)] = (weakref.ref(slopes), alibi)
    return entry[1]


def flex_alibi(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor, scale: float,
               compiled: bool | None = None, block_mask: Any = None) -> torch.Tensor:
    """softmax(q·kᵀ·scale − slope_h·(i−j), causal)·v through FlexAttention.

    The same function as `attend` with `alibi_bias` (a test compares values and gradients):
    the bias is computed inside the kernel from the per-head ``slopes`` (fp32), and the
    causal BlockMask skips the blocks above the diagonal instead of adding −inf to them.
    ``compiled`` (default: on CUDA) runs the kernel torch.compile generates; uncompiled is
    FlexAttention's reference path, which materialises the T×T scores (CPU tests only: in
    torch 2.13 FlexAttention has no backward on CPU).
    """
    if block_mask is None:
        block_mask = causal_block_mask(q.shape[-2], q.device)
    kernel = _flex_kernel(q.is_cuda if compiled is None else compiled)
    return kernel(q, k, v, score_mod=alibi_score_mod(slopes), block_mask=block_mask, scale=scale)


class ScaledLinear(nn.Linear):
    """A bias-free ``nn.Linear`` whose weight is used × a constant and × the gain of the
    RMSNorm that feeds it.

    Both are folded into the weight at use time: (x̂·g)·Wᵀ·c = x̂·(c·W·diag(g))ᵀ. Scaling
    the weight (out×in numbers) instead of the activations (tokens×in or tokens×out) makes
    the µP/CompleteP multipliers and the norm gains nearly free: at 4,096 tokens per step
    it is 5-60× fewer multiplies for our shapes, and no activation-sized tensor is
    allocated, saved for the backward, or multiplied again in it. A multiplier of 1.0 and
    no gain skip the multiply. The function is the same; only the rounding order differs.
    """

    def __init__(self, in_features: int, out_features: int, multiplier: float = 1.0) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.multiplier = multiplier

    def forward(self, x: torch.Tensor, input_gain: torch.Tensor | None = None) -> torch.Tensor:
        weight = self.weight
        if input_gain is not None:
            # (out, in) × (in,): one per-input-channel scale, the norm's gain (× c if any).
            weight = weight * (input_gain if self.multiplier == 1.0 else input_gain * self.multiplier)
        elif self.multiplier != 1.0:
            weight = weight * self.multiplier
        return F.linear(x, weight)


class ScaledEmbedding(nn.Embedding):
    """``nn.Embedding`` whose output is × a constant, folded into the (V × d) table."""

    def __init__(self, num_embeddings: int, embedding_dim: int, multiplier: float = 1.0) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.multiplier = multiplier

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.multiplier == 1.0:
            return F.embedding(idx, self.weight)
        return F.embedding(idx, self.weight * self.multiplier)


class _UnitRMSNormCPU(torch.autograd.Function):
    """x̂ = x·(mean(x²) + ε)^-½ over the last dim (RMSNorm without its gain), CPU eager.

    On CPU (torch 2.13) ``F.rms_norm`` is a composite of ~6 ops whose autograd backward
    adds ~15 more (pow, an expanded mean, muls, copies): fwd+bwd of one (4096, 64) norm
    with its gain took ~3.5× LayerNorm's fused kernel, and the 5-11 norms of our models
    were the largest gap to a plain LayerNorm GPT. Here: one fused reduction forward and
    the closed-form backward,
        r = (‖x‖²/d + ε)^-½,   x̂ = x·r,   ∂x = r·(g − x̂·(g·x̂)/d)
    about LayerNorm's cost (the gain is folded into the next matmul, see ScaledLinear).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        normed = x * rstd
        ctx.save_for_backward(normed, rstd)
        return normed

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        normed, rstd = ctx.saved_tensors
        dot = torch.linalg.vecdot(grad, normed, dim=-1).unsqueeze_(-1).div_(normed.shape[-1])
        return torch.addcmul(grad, normed, dot, value=-1.0).mul_(rstd), None


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain and no bias.

    ``normalize(x)`` is x̂ without the gain: the blocks and the lm_head fold the gain into
    the matmul that reads x̂ (ScaledLinear's ``input_gain``); ``forward`` applies it.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        # CUDA has a fused rms_norm kernel, and under torch.compile inductor fuses the
        # composite itself; only CPU eager needs the hand-written one.
        if x.is_cuda or torch.compiler.is_compiling():
            return F.rms_norm(x, (x.shape[-1],), None, self.eps)
        return _UnitRMSNormCPU.apply(x, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x) * self.weight


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, scale: float, output_multiplier: float = 1.0) -> None:
        super().__init__()
        self.n_heads = config.num_heads
        self.d_head = config.head_dim
        self.scale = scale
        self.inner = self.n_heads * self.d_head
        self.qkv = ScaledLinear(config.d_model, 3 * self.inner)
        self.proj = ScaledLinear(self.inner, config.d_model, output_multiplier)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, input_gain: torch.Tensor | None = None,
                slopes: torch.Tensor | None = None, block_mask: Any = None) -> torch.Tensor:
        """``bias`` (1, H, T, T) runs float-mask SDPA; ``bias`` None runs `flex_alibi` with
        ``slopes`` and the causal ``block_mask``."""
        batch, seq, _ = x.shape
        # (B, T, 3·H·hs) -> three (B, H, T, hs) views. split's backward is one cat straight
        # into the (B, T, 3·H·hs) layout the qkv matmul's backward reads; unbinding a
        # permuted view would stack into (3, B, H, T, hs) and then copy again.
        q, k, v = (
            t.view(batch, seq, self.n_heads, self.d_head).transpose(1, 2)
            for t in self.qkv(x, input_gain).split(self.inner, dim=-1)
        )
        if bias is None:
            assert slopes is not None
            y = flex_alibi(q, k, v, slopes, self.scale, block_mask=block_mask)
        else:
            y = attend(q, k, v, bias, self.scale)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.inner))


class SwiGLU(nn.Module):
    def __init__(self, config: ModelConfig, output_multiplier: float = 1.0) -> None:
        super().__init__()
        self.d_ff = config.ffn_dim
        # gate and up projections fused into one matrix: one GEMM instead of two.
        self.gate_up = ScaledLinear(config.d_model, 2 * self.d_ff)
        self.down = ScaledLinear(self.d_ff, config.d_model, output_multiplier)

    def forward(self, x: torch.Tensor, input_gain: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = self.gate_up(x, input_gain).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, attention_scale: float, residual: float) -> None:
        super().__init__()
        self.residual = residual
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        ### CompleteP: residual branches × m_L^-α, folded into each branch's output matrix ###
        self.attn = Attention(config, attention_scale, output_multiplier=residual)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config, output_multiplier=residual)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, slopes: torch.Tensor | None = None,
                block_mask: Any = None) -> torch.Tensor:
        # Pre-norm branches; each norm's gain is folded into the matmul that reads it.
        x = x + self.attn(self.attn_norm.normalize(x), bias, self.attn_norm.weight, slopes, block_mask)
        return x + self.mlp(self.mlp_norm.normalize(x), self.mlp_norm.weight)


class GPT(nn.Module):
    """Decoder-only transformer over V tokens; ``forward(idx, targets)`` returns logits or loss."""

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        self.multipliers = forward_multipliers(config)
        # Every forward multiplier sits on a weight (see ScaledLinear): none costs an
        # activation-sized multiply.
        self.vocab_size = config.vocab_size
        self.embed = ScaledEmbedding(config.vocab_size, config.d_model, self.multipliers.embedding)  # × α_in
        self.blocks = nn.ModuleList(
            Block(config, self.multipliers.attention_scale, self.multipliers.residual)
            for _ in range(config.n_layers)
        )
        self.final_norm = RMSNorm(config.d_model, config.norm_eps)
        ### µP: logits × α_out/m_N ###
        self.lm_head = ScaledLinear(config.d_model, config.vocab_size, self.multipliers.logits)
        # Not a parameter and not saved: rebuilt from the config. (1, H, T, T): the 4-D
        # shape SDPA's fused CPU kernel accepts (see `attend`).
        self.register_buffer("alibi", alibi_bias(config.num_heads, config.seq_len)[None], persistent=False)
        # FlexAttention's ALiBi reads the slopes (fp32 under autocast too) instead of the mask.
        self.register_buffer("alibi_slopes", alibi_slopes(config.num_heads), persistent=False)
        # "auto": FlexAttention on CUDA (where torch has it), float-mask SDPA elsewhere;
        # "sdpa" / "flex" force one (tests, benchmarks).
        self.attention_backend: AttentionBackend = "auto"
        # The bias cast to an autocast dtype, made once per (device, dtype) instead of by
        # autocast in every layer of every step.
        self._cast_alibi: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
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

    def _attention_bias(self, seq: int) -> torch.Tensor:
        """The (1, H, seq, seq) ALiBi bias in the dtype attention runs in (autocast's, if on)."""
        bias = self.alibi
        device_type = bias.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            key = (bias.device, dtype)
            if key not in self._cast_alibi:
                self._cast_alibi[key] = bias.to(dtype)
            bias = self._cast_alibi[key]
        return bias[:, :, :seq, :seq]

    def uses_flex(self, device: torch.device) -> bool:
        """Whether attention on ``device`` runs through FlexAttention (see ``attention_backend``)."""
        if self.attention_backend == "auto":
            return device.type == "cuda" and flex_attention_available()
        return self.attention_backend == "flex"

    def _residual_stream(self, idx: torch.Tensor) -> torch.Tensor:
        if self.uses_flex(idx.device):
            # First: under torch.compile the (cached) mask lookup is the graph's one break,
            # at its start rather than between layers.
            block_mask = causal_block_mask(idx.shape[1], idx.device)
            bias, slopes = None, self.alibi_slopes
        else:
            block_mask, bias, slopes = None, self._attention_bias(idx.shape[1]), None
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, bias, slopes, block_mask)
        return x

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden state (B, T, d), with the gain (the logit multiplier is in lm_head)."""
        return self.final_norm(self._residual_stream(idx))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self._residual_stream(idx)
        logits = self.lm_head(self.final_norm.normalize(x), self.final_norm.weight)
        if targets is None:
            return logits
        # Loss in fp32 even under bf16 autocast.
        return F.cross_entropy(logits.float().view(-1, self.vocab_size), targets.reshape(-1))
