"""The GPT module: parameter count, shapes, causality, ALiBi, no biases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainers.config import ModelConfig
from trainers.model import GPT, VOCAB_SIZE, alibi_bias, alibi_slopes, attend


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


def test_cpu_attention_matches_sdpa() -> None:
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=generator) for _ in range(3))
    bias = alibi_bias(3, 16)
    # The CPU path computes what the CUDA path (SDPA with the ALiBi mask) computes.
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    torch.testing.assert_close(attend(q, k, v, bias, 0.3), expected)
