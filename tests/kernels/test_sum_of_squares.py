"""The gradient norm's Triton sum of squares (kenotron/kernels/sum_of_squares.py): against float64
through Triton's CPU interpreter, against torch's norm on CUDA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.triton_interpreter import interpreter_job

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@needs_triton
@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("sum_of_squares_child.py")))
def test_triton_sum_of_squares_matches_float64_in_the_interpreter(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs a CUDA device and triton")
def test_gradient_norm_on_cuda_uses_the_kernel_and_equals_torchs_norm():
    from kenotron.kernels.sum_of_squares import sum_of_squares
    from kenotron.parallel import grad_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(s, generator=g, device="cuda").bfloat16() for s in ((4096, 1000), (3,), (123457,))]
    want = torch.linalg.vector_norm(torch.cat([t.double().flatten() for t in grads]))
    norm = grad_norm.total_grad_norm(grads, kernel="triton")
    assert torch.equal(norm, sum_of_squares(grads).sqrt())
    assert abs(norm.item() - want.item()) <= 1e-6 * want.item()
    assert abs(grad_norm.total_grad_norm(grads, kernel="torch").item() - want.item()) <= 1e-6 * want.item()
