"""The MoE experts' fused gate (silu(gate) * up * routing weight per row) equals the PyTorch ops,
on the CPU through Triton's interpreter, and on a GPU in bf16 within bf16 rounding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.triton_interpreter import interpreter_job

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("expert_swiglu_child.py")))
def test_fused_expert_gate_matches_pytorch_ops_in_value_and_gradients(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_fused_expert_gate_on_cuda_in_bf16_stays_within_bf16_rounding_of_fp32():
    import torch

    from kenotron.kernels.expert_swiglu import triton_expert_swiglu
    from kenotron.models.common.experts import swiglu_rows

    torch.manual_seed(0)
    h = torch.randn(8192, 2 * 768, device="cuda")
    scale = torch.rand(8192, device="cuda")
    grad = torch.randn(8192, 768, device="cuda")
    hb = h.bfloat16().requires_grad_()
    sb = scale.clone().requires_grad_()
    out = triton_expert_swiglu(hb, sb)
    dh, ds = torch.autograd.grad(out, (hb, sb), grad.bfloat16())
    h32, s32 = hb.detach().float().requires_grad_(), scale.clone().requires_grad_()
    ref = swiglu_rows(h32, s32)
    rh, rs = torch.autograd.grad(ref, (h32, s32), grad.bfloat16().float())
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dh.float(), rh, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ds, rs, rtol=1e-3, atol=1e-2)
