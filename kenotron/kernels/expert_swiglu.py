"""The MoE experts' gate in one Triton kernel: silu(gate) * up * scale per row.

The experts' first grouped GEMM writes h = [gate | up] (rows, 2F); the second reads
silu(gate) * up scaled by each row's routing weight. In PyTorch ops that is a chunk, a silu, two
multiplies forward and more backward, each a pass over (rows, F) activations (131k rows for
Qwen3-30B-A3B's width at 16k tokens). Here: one kernel forward (reads h and the scales, writes
the (rows, F) product) and one backward (reads the gradient, h and the scales; writes dh
(rows, 2F) and each row's scale gradient, a sum over F), computing in fp32.

Where it runs: with `end`, the gate of every grouped GEMM on CUDA (`Choices.expert_gate`,
kernel_choice/tuning.py's resolve_expert_gate), in eager and compiled blocks alike
(models/common/grouped_tail.py's swiglu_rows_until): faster than Inductor's fusion of the PyTorch
ops (docs/performance.md). The rows from `end` (the last group's end, read on the device) on are
in no group; the kernels leave them unwritten instead of passing over them, which matters most in
expert parallel's even split, whose grouped buffer is planned for the worst case, about twice the
rows routing fills. Without `end` (`triton_expert_swiglu`): the per-expert loop's gate in eager
CUDA blocks (tuning.eager_kernels). Importing this module needs `triton`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(h_ptr, s_ptr, out_ptr, end_ptr, F, BLOCK: tl.constexpr, BOUNDED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < F
    if BOUNDED:  # rows from the last group's end on belong to no expert: left unwritten
        # (compared as a vector: Triton's interpreter rejects a scalar mask and'ed with a vector)
        m = m & (row + 0 * cols < tl.load(end_ptr))
    gate = tl.load(h_ptr + row * 2 * F + cols, mask=m, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * 2 * F + F + cols, mask=m, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + row).to(tl.float32)
    tl.store(out_ptr + row * F + cols, (gate * tl.sigmoid(gate) * up * s).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(g_ptr, h_ptr, s_ptr, dh_ptr, ds_ptr, end_ptr, F, BLOCK: tl.constexpr, BOUNDED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < F
    if BOUNDED:
        m = m & (row + 0 * cols < tl.load(end_ptr))
    g = tl.load(g_ptr + row * F + cols, mask=m, other=0.0).to(tl.float32)
    gate = tl.load(h_ptr + row * 2 * F + cols, mask=m, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * 2 * F + F + cols, mask=m, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + row).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    # d silu(a) / da = sigmoid(a) * (1 + a * (1 - sigmoid(a)))
    dgate = g * s * up * sig * (1.0 + gate * (1.0 - sig))
    tl.store(dh_ptr + row * 2 * F + cols, dgate.to(dh_ptr.dtype.element_ty), mask=m)
    tl.store(dh_ptr + row * 2 * F + F + cols, (g * s * silu).to(dh_ptr.dtype.element_ty), mask=m)
    ds = tl.sum(g * silu * up, axis=0).to(ds_ptr.dtype.element_ty)
    if BOUNDED:
        tl.store(ds_ptr + row, ds, mask=row < tl.load(end_ptr))
    else:
        tl.store(ds_ptr + row, ds)


def expert_swiglu_forward(h: torch.Tensor, scale: torch.Tensor, end: torch.Tensor | None = None) -> torch.Tensor:
    """silu(h[:, :F]) * h[:, F:] * scale[:, None]; with `end` (a 1-element int tensor on the
    device), rows from end[0] on are left unwritten."""
    h, scale = h.contiguous(), scale.contiguous()
    rows, width = h.shape
    out = torch.empty((rows, width // 2), dtype=h.dtype, device=h.device)
    if rows:
        _fwd_kernel[(rows,)](h, scale, out, scale if end is None else end, width // 2,
                             BLOCK=triton.next_power_of_2(width // 2), BOUNDED=end is not None)
    return out


def expert_swiglu_backward(grad: torch.Tensor, h: torch.Tensor, scale: torch.Tensor,
                           end: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dscale) of `expert_swiglu_forward`; with `end`, rows from end[0] on are left unwritten."""
    grad, h, scale = grad.contiguous(), h.contiguous(), scale.contiguous()
    rows, width = h.shape
    dh = torch.empty_like(h)
    dscale = torch.empty_like(scale)
    if rows:
        _bwd_kernel[(rows,)](grad, h, scale, dh, dscale, scale if end is None else end, width // 2,
                             BLOCK=triton.next_power_of_2(width // 2), BOUNDED=end is not None)
    return dh, dscale


class _ExpertSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, scale)
        return expert_swiglu_forward(h, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return expert_swiglu_backward(grad, *ctx.saved_tensors)


def triton_expert_swiglu(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :F]) * h[:, F:] * scale[:, None] for h (rows, 2F) and scale (rows,), in one kernel."""
    if h.dim() != 2 or h.shape[1] % 2 or scale.shape != h.shape[:1]:
        raise ValueError(f"expects h (rows, 2F) and scale (rows,), got {tuple(h.shape)} and {tuple(scale.shape)}")
    return _ExpertSwiGLU.apply(h, scale)
