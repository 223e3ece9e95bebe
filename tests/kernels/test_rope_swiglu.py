"""The fused Triton RoPE and SwiGLU gate equal the PyTorch ops, run on the CPU through Triton's
interpreter (a child process: TRITON_INTERPRET must be set before triton is imported)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.triton_interpreter import interpreter_job

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("rope_swiglu_child.py")))
def test_fused_rope_gate_and_a_whole_model_match_pytorch_ops_in_value_and_gradient(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_fused_kernels_on_cuda_in_bf16_stay_within_bf16_rounding_of_fp32_pytorch():
    import torch
    import torch.nn.functional as F

    from kenotron.kernels.rope_swiglu import triton_rope, triton_silu_mul
    from kenotron.models.common.rope import apply_rope, rope_cos_sin

    torch.manual_seed(0)
    dev = torch.device("cuda")
    cos, sin = rope_cos_sin(64, 512, 500000.0, None, device=dev)
    x = torch.randn(2, 512, 32 * 64, device=dev).view(2, 512, 32, 64)
    grad = torch.randn(2, 32, 512, 64, device=dev).transpose(1, 2)
    xb = x.bfloat16().requires_grad_()
    out = triton_rope(xb, cos, sin)
    (gx,) = torch.autograd.grad(out, xb, grad.bfloat16())
    x32 = xb.detach().float().requires_grad_()
    ref = apply_rope(x32, cos, sin)
    (gref,) = torch.autograd.grad(ref, x32, grad)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx.float(), gref, rtol=1e-2, atol=1e-2)
    a, b, g = (torch.randn(4096, 8192, device=dev) for _ in range(3))
    ab, bb = a.bfloat16().requires_grad_(), b.bfloat16().requires_grad_()
    out = triton_silu_mul(ab, bb)
    da, db = torch.autograd.grad(out, (ab, bb), g.bfloat16())
    a32, b32 = ab.detach().float().requires_grad_(), bb.detach().float().requires_grad_()
    ref = F.silu(a32) * b32
    ra, rb = torch.autograd.grad(ref, (a32, b32), g.bfloat16().float())
    for o, r in ((out, ref), (da, ra), (db, rb)):
        torch.testing.assert_close(o.float(), r, rtol=1e-2, atol=1e-2)
