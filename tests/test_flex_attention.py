"""ALiBi through FlexAttention (the CUDA path) computes the float-mask SDPA attention (the CPU
path): values and gradients, at the kernel and through the whole model.

In torch 2.13 FlexAttention runs forward-only on CPU (its reference path), so the gradient
checks run where it has a backward (CUDA) and skip here with the reason."""

from __future__ import annotations

import pytest
import torch

from trainers.config import ModelConfig
from trainers.model import GPT, alibi_bias, alibi_slopes, attend, flex_alibi, flex_attention_available

pytestmark = pytest.mark.skipif(not flex_attention_available(), reason="this torch has no FlexAttention")
CUDA = torch.cuda.is_available()


def _qkv(heads: int, seq: int, device: str, grad: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seq)
    return tuple(torch.randn(2, heads, seq, 16, generator=generator).to(device).requires_grad_(grad) for _ in range(3))


@pytest.mark.parametrize("seq", [128, 100])
def test_flex_alibi_values_equal_the_float_mask_attention(seq: int) -> None:
    # Six heads (not a power of two: the completed slope series) at a length that is and one
    # that is not a multiple of FlexAttention's 128-token block.
    q, k, v = _qkv(6, seq, "cpu", grad=False)
    reference = attend(q, k, v, alibi_bias(6, seq)[None], 0.25)
    flex = flex_alibi(q, k, v, alibi_slopes(6), 0.25, compiled=False)
    torch.testing.assert_close(flex, reference)


def _gradients_or_skip(device: str, seq: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    q, k, v = _qkv(4, seq, device, grad=True)
    grad_out = torch.randn(2, 4, seq, 16, generator=torch.Generator().manual_seed(1)).to(device)
    try:
        flex = flex_alibi(q, k, v, alibi_slopes(4).to(device), 0.25)
        flex_grads = torch.autograd.grad(flex, (q, k, v), grad_out)
    except NotImplementedError as exc:  # torch 2.13 on CPU: no FlexAttention backward
        pytest.skip(f"FlexAttention has no backward on {device} in this torch: {exc}")
    reference = attend(q, k, v, alibi_bias(4, seq)[None].to(device), 0.25)
    return flex_grads, torch.autograd.grad(reference, (q, k, v), grad_out)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA"))])
def test_flex_alibi_gradients_equal_the_float_mask_attention(device: str) -> None:
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    flex_grads, reference_grads = _gradients_or_skip(device, 256)
    for a, b in zip(flex_grads, reference_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _model() -> GPT:
    config = ModelConfig(d_model=64, n_layers=2, d_head=16, seq_len=96, base_d_model=32)
    return GPT(config, generator=torch.Generator().manual_seed(3))


def test_the_model_picks_flex_on_cuda_only_and_both_paths_agree() -> None:
    model = _model()
    # "auto": FlexAttention on CUDA, float-mask SDPA on CPU (faster there, and trainable).
    assert not model.uses_flex(torch.device("cpu"))
    assert model.uses_flex(torch.device("cuda"))
    idx = torch.randint(0, 256, (3, 96), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        sdpa = model(idx, idx)
        model.attention_backend = "flex"
        flex = model(idx, idx)
    torch.testing.assert_close(flex, sdpa)


@pytest.mark.skipif(not CUDA, reason="no CUDA: the model's FlexAttention backward runs on CUDA only")
def test_model_gradients_agree_on_cuda() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    grads = {}
    for backend in ("sdpa", "flex"):
        model = _model().cuda()
        model.attention_backend = backend
        idx = torch.randint(0, 256, (3, 96), generator=torch.Generator().manual_seed(4)).cuda()
        model(idx, idx).backward()
        grads[backend] = [p.grad for p in model.parameters()]
    for a, b in zip(grads["flex"], grads["sdpa"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
