"""Run by test_expert_swiglu.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the fused experts' gate against the PyTorch ops it replaces. Exits non-zero on a mismatch."""

from __future__ import annotations

import torch

from kenotron.kernels.expert_swiglu import triton_expert_swiglu
from kenotron.models.common.experts import swiglu_rows


def check(rows: int, ffn: int) -> None:
    h = torch.randn(rows, 2 * ffn, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(rows, dtype=torch.float64)
    scale[::3] = 0.0  # padding rows carry weight 0
    scale.requires_grad_()
    grad = torch.randn(rows, ffn, dtype=torch.float64)
    ref = swiglu_rows(h, scale)
    ref_grads = torch.autograd.grad(ref, (h, scale), grad)
    out = triton_expert_swiglu(h, scale)
    out_grads = torch.autograd.grad(out, (h, scale), grad)
    # fp32 math inside the kernel
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(out_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


check(7, 48)   # F not a power of two
check(5, 64)
check(0, 32)   # an empty expert buffer
print("ok")
