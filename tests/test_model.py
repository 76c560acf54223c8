"""The GPT module: parameter count, shapes, causality, ALiBi, no biases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainers.config import ModelConfig
from trainers.model import GPT, VOCAB_SIZE, RMSNorm, alibi_bias, alibi_slopes, attend


def _model(seed: int = 0, **shape: int | float | str | None) -> GPT:
    defaults = {"d_model": 32, "n_layers": 2, "d_head": 16, "seq_len": 16, "base_d_model": 32, "init_std": 0.02}
    config = ModelConfig(**{**defaults, **shape})
    return GPT(config, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "shape",
    [
        {"d_model": 32, "n_layers": 1},
        {"d_model": 64, "n_layers": 3, "d_ff": 100},
        {"d_model": 48, "n_layers": 2, "n_heads": 3, "d_head": None, "base_d_model": 48},
    ],
)
def test_non_embedding_count_matches_config(shape: dict) -> None:
    model = _model(**shape)
    # ModelConfig.n_params (used before any tensor exists) counts exactly the non-embedding parameters.
    assert model.n_params() == model.config.n_params
    # ... and the embedding + lm_head make up the rest.
    assert model.n_params(non_embedding=False) - model.n_params() == model.config.n_embedding_params


def test_no_biases_and_untied_embeddings() -> None:
    model = _model()
    # No parameter is a bias, and embedding and lm_head are different tensors.
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert model.embed.weight.data_ptr() != model.lm_head.weight.data_ptr()


def test_logits_shape_and_initial_loss_near_uniform() -> None:
    model = _model()
    idx = torch.randint(0, VOCAB_SIZE, (3, 16), generator=torch.Generator().manual_seed(1))
    # Logits are (batch, seq, 256); at init (small weights) the loss is close to ln 256.
    assert model(idx).shape == (3, 16, VOCAB_SIZE)
    assert model(idx, idx).item() == pytest.approx(math.log(VOCAB_SIZE), abs=0.05)


def test_attention_is_causal() -> None:
    model = _model()
    idx = torch.randint(0, VOCAB_SIZE, (1, 16), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % VOCAB_SIZE
    # Changing tokens from position 10 on leaves the logits of positions < 10 unchanged.
    torch.testing.assert_close(model(idx)[0, :10], model(changed)[0, :10])


def test_shorter_sequences_use_a_slice_of_the_bias() -> None:
    model = _model()
    idx = torch.randint(0, VOCAB_SIZE, (1, 16), generator=torch.Generator().manual_seed(3))
    # A prefix gives the same logits as the full sequence at those positions.
    torch.testing.assert_close(model(idx[:, :7]), model(idx)[:, :7])


def test_alibi_slopes() -> None:
    # Powers of two: the geometric series 2^(-8i/n).
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    # Other counts: distinct slopes, all in (0, 1).
    for n_heads in (3, 6, 12):
        slopes = alibi_slopes(n_heads)
        assert len(set(slopes.tolist())) == n_heads and bool(((slopes > 0) & (slopes < 1)).all())


def test_alibi_bias_penalises_distance_and_masks_future() -> None:
    bias = alibi_bias(2, 4)
    # Zero on the diagonal, −slope·distance below it, −inf above it.
    assert bias[0, 2, 2] == 0.0
    assert bias[0, 3, 1] == pytest.approx(-2 * alibi_slopes(2)[0].item())
    assert torch.isinf(bias[1, 1, 2]) and bias[1, 1, 2] < 0


def test_init_is_seeded() -> None:
    # The same init seed gives the same weights; another seed does not.
    assert all(torch.equal(a, b) for a, b in zip(_model(5).state_dict().values(), _model(5).state_dict().values()))
    assert not torch.equal(_model(5).lm_head.weight, _model(6).lm_head.weight)


def _manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """The textbook three-op attention: softmax(q·kᵀ·scale + bias)·v."""
    return torch.matmul((torch.matmul(q, k.transpose(-2, -1)) * scale + bias).softmax(dim=-1), v)


@pytest.mark.parametrize("seq", [16, 11])
def test_sdpa_attention_matches_the_manual_softmax(seq: int) -> None:
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, seq, 8, generator=generator, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(2, 3, seq, 8, generator=generator)
    # The model's bias: (1, H, T, T), sliced to shorter sequences.
    bias = alibi_bias(3, 16)[None, :, :seq, :seq]
    fused = attend(q, k, v, bias, 0.3)
    fused_grads = torch.autograd.grad(fused, (q, k, v), grad_out)
    manual = _manual_attention(q, k, v, bias, 0.3)
    manual_grads = torch.autograd.grad(manual, (q, k, v), grad_out)
    # SDPA with the ALiBi mask (used on every device) computes the manual function, and its
    # gradients, to float tolerance.
    torch.testing.assert_close(fused, manual)
    for a, b in zip(fused_grads, manual_grads):
        torch.testing.assert_close(a, b)


def test_cpu_rms_norm_matches_torch_in_value_and_gradient() -> None:
    generator = torch.Generator().manual_seed(10)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(generator=generator)
    x = (3.0 * torch.randn(2, 5, 24, generator=generator)).requires_grad_()
    grad_out = torch.randn(2, 5, 24, generator=generator)
    ours = norm(x)
    ours_grads = torch.autograd.grad(ours, (x, norm.weight), grad_out)
    reference = F.rms_norm(x, (24,), norm.weight, 1e-5)
    reference_grads = torch.autograd.grad(reference, (x, norm.weight), grad_out)
    # The hand-written CPU norm (closed-form backward) is torch's RMSNorm to float
    # tolerance, in value and in both gradients ...
    torch.testing.assert_close(ours, reference)
    for a, b in zip(ours_grads, reference_grads):
        torch.testing.assert_close(a, b)
    # ... and its backward is the exact derivative (finite differences, float64).
    double = x.detach().double().requires_grad_()
    assert torch.autograd.gradcheck(norm.normalize, (double,))


def test_multipliers_folded_into_weights_compute_the_activation_form() -> None:
    # CompleteP away from the base: α_in, α_out/m_N = 0.75 and m_L^-1 = 1/3 are all live,
    # and so are the RMSNorm gains.
    model = _model(d_model=64, n_layers=3, base_d_model=32, base_n_layers=1, alpha_in=3.0, alpha_out=1.5)
    with torch.no_grad():  # trained-looking norm gains (they start at ones), folded into matmuls too
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    multipliers = model.multipliers
    assert multipliers.embedding == 3.0 and multipliers.logits == 0.75 and multipliers.residual == pytest.approx(1 / 3)
    idx = torch.randint(0, VOCAB_SIZE, (2, 16), generator=torch.Generator().manual_seed(8))
    # The same forward written with the multipliers and gains on the activations, as in the µP papers.
    x = F.embedding(idx, model.embed.weight) * multipliers.embedding
    bias = alibi_bias(model.config.num_heads, 16)
    def rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        return F.rms_norm(x, (64,), norm.weight, 1e-5)

    for block in model.blocks:
        h = rms(x, block.attn_norm)
        q, k, v = F.linear(h, block.attn.qkv.weight).view(2, 16, 3, -1, 16).permute(2, 0, 3, 1, 4)
        y = _manual_attention(q, k, v, bias, multipliers.attention_scale).transpose(1, 2).reshape(2, 16, 64)
        x = x + multipliers.residual * F.linear(y, block.attn.proj.weight)
        gate, up = F.linear(rms(x, block.mlp_norm), block.mlp.gate_up.weight).chunk(2, dim=-1)
        x = x + multipliers.residual * F.linear(F.silu(gate) * up, block.mlp.down.weight)
    expected = F.linear(rms(x, model.final_norm) * multipliers.logits, model.lm_head.weight)
    # Folding each multiplier and gain into its weight changes the rounding order, not the function.
    torch.testing.assert_close(model(idx), expected)


def test_bf16_autocast_keeps_one_cast_copy_of_the_bias() -> None:
    model = _model()
    idx = torch.randint(0, VOCAB_SIZE, (2, 16), generator=torch.Generator().manual_seed(9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, second = model(idx, idx), model(idx, idx)
    # Under autocast attention gets a bf16 ALiBi bias, cast once and reused by every call;
    # the loss stays fp32 and close to the fp32 model's.
    assert list(model._cast_alibi) == [(model.alibi.device, torch.bfloat16)]
    assert first.dtype == torch.float32 and torch.equal(first, second)
    assert first.item() == pytest.approx(model(idx, idx).item(), abs=0.05)
