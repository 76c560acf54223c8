"""What ``benchmarks/trainer_throughput.py`` times: the step functions and the shapes they run at.

What lives here: the benchmark's shapes (CPU sizes at T 128; ``--device cuda`` sizes, set per
worker process by :func:`use_device`), the trainer's config at a shape (:func:`_train_config`),
the reference models written in plain PyTorch (the plain GPT with any subset of the trainer's
features, :func:`_plain_gpt`; ``nn.TransformerEncoder``, :func:`_torch_encoder`) with their bare
training loop (:func:`_loop`), the trainer of another checkout (:func:`_baseline_trainer`), and
:func:`build`, which turns an implementation's name into (step function, N).

Why apart: ``benchmarks/trainer_throughput.py`` is the timing harness (alternating rounds, the
matmul peak, FLOP accounting, the torch.compile and curve comparisons) and the command line;
what it times is defined here, once. ``use_device`` rebinds ``SEQ_LEN``, ``BATCH_TOKENS``,
``D_HEAD``, ``BASE_D_MODEL``, ``DEVICE`` and ``COMPILE`` in this module, so other modules read
them as attributes of this module (never ``from ... import SEQ_LEN``, which would keep the
CPU default). Nothing here imports ``trainers`` at import time (``--curves`` workers must put
their checkout on ``sys.path`` first).
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

# Shapes: (d_model, n_layers) giving ~0.1M, ~1M and ~3M non-embedding parameters.
SIZES: dict[str, tuple[int, int]] = {"0.1M": (64, 2), "1M": (128, 5), "3M": (256, 4)}
SEQ_LEN = 128
BATCH_TOKENS = 4096
D_HEAD = 32
# µP base shape of the benchmark: every size is away from it, so all factors are live.
BASE_D_MODEL, BASE_N_LAYERS = 32, 1
IMPLEMENTATIONS = ("trainer", "trainer-sp", "plain", "plain+features", "torch-encoder")
# --device cuda: issue 27's shapes (d_model, n_layers, T), d_head 64, 32 sequences per step,
# bf16 autocast; the plain GPT (nanoGPT-style, written here) is the reference.
GPU_SIZES: dict[str, tuple[int, int, int]] = {
    "25M": (512, 8, 1024), "85M": (768, 12, 1024), "200M": (1024, 16, 1024), "85M-T2048": (768, 12, 2048),
}
GPU_IMPLEMENTATIONS = ("trainer", "plain")
GPU_SEQUENCES = 32
DEVICE = "cpu"  # set per worker process by use_device()
COMPILE = False  # --device cuda --compile-models: both sides through torch.compile


def use_device(device: str, size: str, compiled: bool = False) -> tuple[int, int]:
    """Point this (worker) process's shapes at ``device``: the CPU sizes at T 128 as before, or
    a GPU size with its T, d_head 64 and a base shape of one 64-wide head. Returns (d, L)."""
    global SEQ_LEN, BATCH_TOKENS, D_HEAD, BASE_D_MODEL, DEVICE, COMPILE
    DEVICE, COMPILE = device, compiled
    if device == "cpu":
        return SIZES[size]
    d_model, n_layers, SEQ_LEN = GPU_SIZES[size]
    D_HEAD, BASE_D_MODEL, BATCH_TOKENS = 64, 64, GPU_SEQUENCES * SEQ_LEN
    return d_model, n_layers


Step = Callable[[], Any]


def _train_config(parameterization: str, d_model: int, n_layers: int, threads: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": {
            "d_model": d_model,
            "n_layers": n_layers,
            "d_head": D_HEAD,
            "seq_len": SEQ_LEN,
            "base_d_model": BASE_D_MODEL,
            "base_n_layers": BASE_N_LAYERS,
            "parameterization": parameterization,
        },
        "batch_size": BATCH_TOKENS,
        "tokens_per_param": 1e4,  # long enough never to finish during a measurement
        "lr": 3e-3,
        "tau": 0.3,
        "log_every": 2,
        "threads": threads,
        "device": DEVICE,
        **extra,
    }


def _sampler(data_seed: int = 0) -> Any:
    from trainers.config import DataConfig
    from trainers.data import TrainSampler, load_corpus, split_corpus

    train, _ = split_corpus(load_corpus(DataConfig()).tokens, 0.1)
    return TrainSampler(train, SEQ_LEN, data_seed=data_seed)


FEATURES = ("alibi", "swiglu", "mup")  # what "plain+features" switches on
PLAIN_FEATURES = (*FEATURES, "rmsnorm")  # any subset can be timed: --implementations plain+alibi+rmsnorm


def _plain_features(implementation: str) -> frozenset[str]:
    """"plain" -> {}, "plain+features" -> FEATURES, "plain+alibi+mup" -> {alibi, mup}."""
    parts = implementation.split("+")[1:]
    features = frozenset(FEATURES if parts == ["features"] else parts)
    unknown = features - set(PLAIN_FEATURES)
    if unknown:
        raise ValueError(f"{implementation}: unknown features {sorted(unknown)} (known: {PLAIN_FEATURES})")
    return features


def _plain_gpt(d_model: int, n_layers: int, features: frozenset[str]) -> Any:
    """A plain pre-LN GPT; ``features`` switch on ALiBi, SwiGLU, µP/CompleteP (the plain way:
    activation multipliers and per-group AdamW, :func:`_plain_groups`) and RMSNorm instead of
    LayerNorm. Returns (model, AdamW param groups, N)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from trainers.config import default_ffn_dim
    from trainers.model import alibi_bias

    n_heads = d_model // D_HEAD
    swiglu, alibi, mup = "swiglu" in features, "alibi" in features, "mup" in features
    d_ff = default_ffn_dim(d_model) if swiglu else 4 * d_model
    width, depth = d_model / BASE_D_MODEL, n_layers / BASE_N_LAYERS
    # µP: logits × 1/m_N, CompleteP: residual branches × 1/m_L; 1/√d_head is µP's 1/d_head
    # relative to the base at a fixed head size.
    logit_multiplier, residual = (1.0 / width, 1.0 / depth) if mup else (1.0, 1.0)
    scale = 1.0 / math.sqrt(D_HEAD)

    def norm() -> nn.Module:
        return nn.RMSNorm(d_model, eps=1e-5) if "rmsnorm" in features else nn.LayerNorm(d_model, bias=False)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = norm()
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.ln2 = norm()
            self.up = nn.Linear(d_model, (2 if swiglu else 1) * d_ff, bias=False)
            self.down = nn.Linear(d_ff, d_model, bias=False)

        def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            b, t, _ = x.shape
            # nanoGPT's layout: split the fused projection, then one view + transpose each.
            q, k, v = (h.view(b, t, n_heads, D_HEAD).transpose(1, 2) for h in self.qkv(self.ln1(x)).split(d_model, dim=-1))
            if bias is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
            y = self.proj(y.transpose(1, 2).reshape(b, t, d_model))
            x = x + (y if residual == 1.0 else residual * y)
            h = self.up(self.ln2(x))
            if swiglu:
                gate, up = h.split(d_ff, dim=-1)
                h = F.silu(gate) * up
            else:
                h = F.gelu(h)
            h = self.down(h)
            return x + (h if residual == 1.0 else residual * h)

    class PlainGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, d_model)
            # nanoGPT's learned absolute positions.
            self.pos = None if alibi else nn.Embedding(SEQ_LEN, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln_f = norm()
            self.head = nn.Linear(d_model, 256, bias=False)
            # ALiBi as a (1, H, T, T) float mask: the shape SDPA's fused CPU kernel takes.
            self.register_buffer("alibi", alibi_bias(n_heads, SEQ_LEN)[None] if alibi else None, persistent=False)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx)
            if self.pos is not None:
                x = x + self.pos.weight[: idx.shape[1]]
            for block in self.blocks:
                x = block(x, self.alibi)
            h = self.ln_f(x)
            if logit_multiplier != 1.0:
                h = h * logit_multiplier
            return F.cross_entropy(self.head(h).view(-1, 256), targets.reshape(-1))

    model = PlainGPT()
    return (model, *_plain_groups(model, mup, width, depth))


def _plain_groups(model: Any, mup: bool, width: float, depth: float) -> tuple[list[dict[str, Any]], int]:
    """The plain GPT's AdamW param groups (µP/CompleteP's per-group settings with ``mup``, else the
    usual two) and its N (parameters outside the embeddings and the head)."""
    named = dict(model.named_parameters())
    embedding = [p for n, p in named.items() if n.startswith(("embed", "pos", "head"))]
    hidden = [p for n, p in named.items() if n.startswith("blocks") and p.dim() == 2]
    norms = [p for n, p in named.items() if p.dim() == 1]
    if mup:  # hidden lr/m_N and decay·m_N, ε/m_N (·1/m_L in blocks)
        groups = [
            {"params": embedding, "lr": 3e-3, "weight_decay": 0.1, "eps": 1e-8 / width},
            {"params": hidden, "lr": 3e-3 / width, "weight_decay": 0.1 * width, "eps": 1e-8 / width / depth},
            {"params": norms, "lr": 3e-3, "weight_decay": 0.0, "eps": 1e-8 / width / depth},
        ]
    else:  # the usual two groups: matrices decayed, norm gains not
        groups = [{"params": embedding + hidden, "weight_decay": 0.1}, {"params": norms, "weight_decay": 0.0}]
    n_params = sum(p.numel() for n, p in named.items() if not n.startswith(("embed", "pos", "head")))
    return groups, n_params


def _torch_encoder(d_model: int, n_layers: int) -> Any:
    """nn.TransformerEncoder (pre-LN, GELU, causal) between an embedding and a head."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class EncoderGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, d_model)
            self.pos = nn.Embedding(SEQ_LEN, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, d_model // D_HEAD, 4 * d_model, dropout=0.0, activation="gelu",
                batch_first=True, norm_first=True, bias=False,
            )
            self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            self.ln_f = nn.LayerNorm(d_model, bias=False)
            self.head = nn.Linear(d_model, 256, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ_LEN), persistent=False)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx) + self.pos.weight[: idx.shape[1]]
            x = self.encoder(x, mask=self.mask, is_causal=True)
            return F.cross_entropy(self.head(self.ln_f(x)).view(-1, 256), targets.reshape(-1))

    model = EncoderGPT()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() == 1]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    n_params = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("encoder", "ln_f")))
    return model, groups, n_params


def _loop(model: Any, groups: list[dict[str, Any]]) -> Step:
    """A bare training step: sample, copy, forward, backward, fused AdamW, zero_grad (on CUDA
    under bf16 autocast, the batch copied from pinned memory, as the trainer does)."""
    import contextlib

    import torch

    model.to(DEVICE)
    optimizer = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), fused=True)
    sampler = _sampler()
    cuda = DEVICE == "cuda"
    forward = torch.compile(model) if COMPILE else model

    def step() -> None:
        inputs, targets = sampler.sample(BATCH_TOKENS // SEQ_LEN)
        if cuda:
            inputs = inputs.pin_memory().to(DEVICE, non_blocking=True)
            targets = targets.pin_memory().to(DEVICE, non_blocking=True)
        with torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = forward(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _baseline_trainer(checkout: str) -> Any:
    """The Trainer class of another checkout (e.g. the commit before a change), importable
    next to ours: its trainers/ is copied as package ``trainers_baseline``."""
    import importlib
    import re
    import shutil

    if "trainers_baseline" not in sys.modules:
        target = Path(tempfile.mkdtemp(prefix="trainer-baseline-"))
        shutil.copytree(Path(checkout) / "trainers", target / "trainers_baseline")
        for path in (target / "trainers_baseline").glob("*.py"):
            path.write_text(re.sub(r"\b(from|import) trainers\b", r"\1 trainers_baseline", path.read_text()))
        sys.path.insert(0, str(target))
    return importlib.import_module("trainers_baseline.train").Trainer


def build(implementation: str, d_model: int, n_layers: int, threads: int, baseline: str | None = None) -> tuple[Step, int]:
    """(step function, N) of one implementation at one shape."""
    if implementation == "trainer@baseline":
        assert baseline is not None, "trainer@baseline needs --baseline CHECKOUT"
        trainer = _baseline_trainer(baseline)(_train_config("completep", d_model, n_layers, threads))
        return trainer._train_step, trainer.controls.n_params
    if implementation.startswith("trainer"):
        from trainers.train import Trainer

        # Eager: these runs are long enough that compile "auto" would switch it on (--compile measures that).
        parameterization = "sp" if implementation == "trainer-sp" else "completep"
        trainer = Trainer(_train_config(parameterization, d_model, n_layers, threads, compile=COMPILE),
                          warn_repeats=False)  # a long nominal run, never trained to its end
        # _train_step is the whole hot loop (schedule, sampling, forward, backward, AdamW);
        # train_interval only adds one float conversion per log interval.
        return trainer._train_step, trainer.controls.n_params
    if implementation == "torch-encoder":
        model, groups, n_params = _torch_encoder(d_model, n_layers)
    else:
        model, groups, n_params = _plain_gpt(d_model, n_layers, _plain_features(implementation))
    return _loop(model, groups), n_params
