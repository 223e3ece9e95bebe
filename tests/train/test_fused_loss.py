"""The chunked linear + cross-entropy equals the plain one, in value and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kenotron.train.fused_loss import (
    _chunk_loss_and_grad_for_compile,
    compiled_chunk_fn,
    linear_cross_entropy_sum,
)
from kenotron.train.loss import IGNORE_INDEX


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_loss_and_gradients_equal_plain_in_fp32(chunk):
    torch.manual_seed(0)
    h = torch.randn(2, 30, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (2, 30))
    labels[0, :3] = IGNORE_INDEX
    plain = F.cross_entropy((h @ w.t()).flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)
    gh, gw = torch.autograd.grad(plain * 0.7, (h, w))
    fused = linear_cross_entropy_sum(h, w, labels, chunk_tokens=chunk)
    fh, fw = torch.autograd.grad(fused * 0.7, (h, w))
    torch.testing.assert_close(fused, plain.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fh, gh, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fw, gw, rtol=1e-6, atol=1e-6)


def test_bf16_compute_stays_close_to_the_fp32_loss():
    torch.manual_seed(0)
    h = torch.randn(64, 32)
    w = torch.randn(100, 32) * 0.1
    labels = torch.randint(0, 100, (64,))
    plain = F.cross_entropy(h @ w.t(), labels, reduction="sum")
    fused = linear_cross_entropy_sum(h, w, labels, chunk_tokens=16, compute_dtype=torch.bfloat16)
    assert abs(fused.item() - plain.item()) / plain.item() < 1e-2


def test_bad_chunk_size_is_rejected():
    with pytest.raises(ValueError, match="chunk_tokens=0 must be >= 1"):
        linear_cross_entropy_sum(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), chunk_tokens=0)


@pytest.mark.parametrize("variant", ["compile-form eager", "compiled"])
def test_compiled_chunk_step_equals_plain_loss_and_gradients(variant):
    """The form written for Inductor (fp32 log-sum-exp, one-hot, masked rows), eager and compiled."""
    torch.manual_seed(0)
    h = torch.randn(2, 30, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (2, 30))
    labels[1, -4:] = IGNORE_INDEX
    plain = F.cross_entropy((h @ w.t()).flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)
    gh, gw = torch.autograd.grad(plain * 0.7, (h, w))
    chunk_fn = _chunk_loss_and_grad_for_compile if variant == "compile-form eager" else compiled_chunk_fn()
    fused = linear_cross_entropy_sum(h, w, labels, chunk_tokens=16, chunk_fn=chunk_fn)
    fh, fw = torch.autograd.grad(fused * 0.7, (h, w))
    torch.testing.assert_close(fused, plain.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fh, gh, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fw, gw, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk", [64, 16])  # one chunk (the product kept in bf16), four (fp32 accumulation)
def test_bf16_weight_gradient_is_fp32_and_close_to_the_fp64_gradient(chunk):
    torch.manual_seed(0)
    h = torch.randn(64, 32, dtype=torch.float64)
    w = (torch.randn(100, 32, dtype=torch.float64) * 0.1).float().requires_grad_()
    labels = torch.randint(0, 100, (64,))
    w64 = w.detach().double().requires_grad_()
    plain = F.cross_entropy(h @ w64.t(), labels, reduction="sum")
    (want,) = torch.autograd.grad(plain * 0.5, w64)
    fused = linear_cross_entropy_sum(h.float(), w, labels, chunk_tokens=chunk, compute_dtype=torch.bfloat16)
    (got,) = torch.autograd.grad(fused * 0.5, w)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_backward_twice_gives_the_same_gradient():
    # The backward scales a widened copy in place, never the saved gradient: a second backward
    # through a retained graph sees the same saved values.
    torch.manual_seed(0)
    h = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(100, 32, requires_grad=True)
    labels = torch.randint(0, 100, (64,))
    for dtype in (torch.float32, torch.bfloat16):
        loss = linear_cross_entropy_sum(h, w, labels, chunk_tokens=64, compute_dtype=dtype)
        first = torch.autograd.grad(loss * 0.5, (h, w), retain_graph=True)
        second = torch.autograd.grad(loss * 0.5, (h, w))
        for a, b in zip(first, second, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_backward_scales_bf16_gradients_in_fp32_and_rounds_once():
    """The incoming scale (1/3 here, 1/tokens in training) multiplies each gradient in fp32: the
    result is round_bf16(fp32(g) · scale) of the unscaled gradient g, not g · round_bf16(scale)."""
    torch.manual_seed(0)
    h = torch.randn(64, 32).bfloat16().requires_grad_()
    w = (torch.randn(100, 32) * 0.1).bfloat16().requires_grad_()
    labels = torch.randint(0, 100, (64,))
    g1 = torch.autograd.grad(linear_cross_entropy_sum(h, w, labels, chunk_tokens=64), (h, w))
    scale = torch.tensor(1 / 3)
    g3 = torch.autograd.grad(linear_cross_entropy_sum(h, w, labels, chunk_tokens=64) * scale, (h, w))
    for one, third in zip(g1, g3, strict=True):
        assert third.dtype == torch.bfloat16
        assert torch.equal(third, (one.float() * scale).to(torch.bfloat16))
    rounded_scale = (g1[0] * scale.bfloat16()).to(torch.bfloat16)
    assert not torch.equal(g3[0], rounded_scale)  # the two orders differ on these values
