"""The gradient norm's Triton sum of squares (kenotron/parallel/sum_of_squares.py): against float64
through Triton's CPU interpreter, against torch's norm on CUDA, and the choice of kernel
(`training.grad_norm_kernel`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.triton_interpreter import run_in_triton_interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@needs_triton
def test_triton_sum_of_squares_matches_float64_in_the_interpreter():
    run_in_triton_interpreter(Path(__file__).with_name("sum_of_squares_child.py"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs a CUDA device and triton")
def test_gradient_norm_on_cuda_uses_the_kernel_and_equals_torchs_norm():
    from kenotron.parallel import grad_norm
    from kenotron.parallel.sum_of_squares import sum_of_squares

    g = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(s, generator=g, device="cuda").bfloat16() for s in ((4096, 1000), (3,), (123457,))]
    want = torch.linalg.vector_norm(torch.cat([t.double().flatten() for t in grads]))
    norm = grad_norm.total_grad_norm(grads, kernel="triton")
    assert torch.equal(norm, sum_of_squares(grads).sqrt())
    assert abs(norm.item() - want.item()) <= 1e-6 * want.item()
    assert abs(grad_norm.total_grad_norm(grads, kernel="torch").item() - want.item()) <= 1e-6 * want.item()


def test_grad_norm_kernel_choice_and_errors_name_the_fix():
    from kenotron.config import ConfigError
    from kenotron.train.optim import resolve_grad_norm_kernel

    assert resolve_grad_norm_kernel("auto", "cuda", triton_present=True) == "triton"
    assert resolve_grad_norm_kernel("auto", "cuda", triton_present=False) == "torch"
    assert resolve_grad_norm_kernel("auto", "cpu", triton_present=True) == "torch"
    with pytest.raises(ConfigError, match="training.grad_norm_kernel='triton' needs a CUDA device; use training.grad_norm_kernel='auto' or 'torch'"):
        resolve_grad_norm_kernel("triton", "cpu", triton_present=True)
    with pytest.raises(ConfigError, match=r"needs the triton package \(pip install triton\)"):
        resolve_grad_norm_kernel("triton", "cuda", triton_present=False)
    with pytest.raises(ConfigError, match="training.grad_norm_kernel='cuda' is not one of auto, triton, torch"):
        resolve_grad_norm_kernel("cuda", "cuda")
