"""Run by test_expert_swiglu.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the fused experts' gate against the PyTorch ops it replaces. Exits non-zero on a mismatch."""

from __future__ import annotations

import torch

from kenotron.kernels.expert_swiglu import expert_swiglu_backward, expert_swiglu_forward, triton_expert_swiglu
from kenotron.models.common.experts import swiglu_rows
from tests.kernels.sentinel_outputs import SENTINEL, outputs_start_as_sentinel


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


def check_bounded(rows: int, ffn: int, end: int) -> None:
    """With a bound, the rows before it as without; the rows from it on (outputs started as the
    sentinel) left as they were, forward and backward."""
    h = torch.randn(rows, 2 * ffn, dtype=torch.float64)
    scale = torch.rand(rows, dtype=torch.float64)
    grad = torch.randn(rows, ffn, dtype=torch.float64)
    bound = torch.tensor([end], dtype=torch.int32)
    with outputs_start_as_sentinel():
        out = expert_swiglu_forward(h, scale, bound)
        dh, dscale = expert_swiglu_backward(grad, h, scale, bound)
    full = expert_swiglu_forward(h, scale)
    full_dh, full_dscale = expert_swiglu_backward(grad, h, scale)
    for bounded, whole in ((out, full), (dh, full_dh), (dscale, full_dscale)):
        torch.testing.assert_close(bounded[:end], whole[:end], rtol=0, atol=0)
        assert bool((bounded[end:] == SENTINEL).all()), "rows from the bound on were written"


check(7, 48)   # F not a power of two
check(5, 64)
check(0, 32)   # an empty expert buffer
check_bounded(9, 48, 4)
check_bounded(9, 48, 9)
check_bounded(3, 32, 0)
print("ok")
