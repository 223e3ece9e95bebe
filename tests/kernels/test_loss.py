"""The fused loss's Triton kernels (kenotron/kernels/loss.py): the backward's scale and the
cross-entropy with its gradient, against PyTorch through Triton's CPU interpreter and on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kenotron.train.fused_loss import compiled_chunk_fn, linear_cross_entropy_sum
from kenotron.train.loss import IGNORE_INDEX
from tests.triton_interpreter import interpreter_job


@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("loss_child.py")))
def test_loss_kernels_equal_pytorch_under_the_triton_interpreter(ran_ahead):
    """The scale kernel and the Triton cross-entropy (loss and gradient over the logits); skips
    without triton (the job's importorskip)."""
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scale_kernel_on_cuda_rounds_like_pytorch_bitwise():
    from kenotron.kernels.loss import scale_to

    torch.manual_seed(0)
    x = torch.randn(3_000_001, device="cuda").bfloat16()
    scale = torch.tensor(1 / 16_384 / 3, device="cuda")
    assert torch.equal(scale_to(x, scale, torch.bfloat16), (x.float() * scale).bfloat16())
    h = torch.randn(512, 64, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(1000, 64, device="cuda") * 0.1).bfloat16().requires_grad_()
    labels = torch.randint(0, 1000, (512,), device="cuda")
    g1 = torch.autograd.grad(linear_cross_entropy_sum(h, w, labels, chunk_tokens=512), (h, w))
    g3 = torch.autograd.grad(linear_cross_entropy_sum(h, w, labels, chunk_tokens=512) * scale, (h, w))
    for one, third in zip(g1, g3, strict=True):
        assert torch.equal(third, (one.float() * scale).bfloat16())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_cross_entropy_on_cuda_matches_the_compiled_step_in_bf16():
    from kenotron.train.fused_loss import _triton_chunk_loss_and_grad

    torch.manual_seed(0)
    h = torch.randn(1024, 256, device="cuda").bfloat16()
    w = (torch.randn(128_256, 256, device="cuda") * 0.05).bfloat16()
    labels = torch.randint(0, 128_256, (1024,), device="cuda")
    labels[:7] = IGNORE_INDEX
    loss, grad = _triton_chunk_loss_and_grad(h, w, labels)
    ref_loss, ref_grad = compiled_chunk_fn()(h, w, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=1e-2, atol=1e-5)
