"""The row gathers and the gate of the experts' grouped buffer, stopping where its last group
ends: custom ops (torch.library) over kenotron/kernels' Triton kernels on CUDA.

Expert parallel's even split (parallel/expert_even_split.py) plans its grouped buffer for the
worst case: every received slot on this rank, ep * T * min(k, local) rows where routing fills
about T * k (half the buffer at ep 2). The grouped GEMMs compute only up to the last group's end,
but a gather (index_select), or the gate as PyTorch ops or Inductor's fusion of them, passes over
every row: they cannot know the end without reading it on the host. These ops take the end as a
1-element tensor on the device and leave the rows from it on unwritten, which nothing reads
(torch._grouped_mm stops at its last offset; the sums back per token read real rows only).

On other devices they compute every row with the PyTorch ops: the same values on the rows that
count. Custom ops rather than autograd functions: torch.compile keeps them whole inside compiled
blocks (Inductor would otherwise fuse the PyTorch ops back over the whole buffer).

Beside them, `sum_copy_rows_op`: each token's k rows summed where they lie, for the experts' first
product's backward (models/common/experts.py), which runs eager inside a custom op: on CUDA one
Triton kernel instead of PyTorch's copy of the k rows and its sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def gather_token_rows(x: Tensor, src_copy: Tensor, k: int) -> Tensor:
    """(tokens, ...) -> (len(src_copy), ...): row p is the token of copy src_copy[p] (token * k +
    slot); copy tokens * k, the padding's mark, reads one zero row past the end."""
    padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
    return padded.index_select(0, torch.div(src_copy, k, rounding_mode="floor"))


def sum_token_copies(y: Tensor, dest_row: Tensor, k: int) -> Tensor:
    """(rows, ...) -> (len(dest_row) // k, ...): token t the sum of y's rows dest_row[t*k:(t+1)*k]
    (PyTorch's ops: Inductor fuses them inside compiled blocks)."""
    picked = y.index_select(0, dest_row)
    return picked.view(dest_row.shape[0] // k, k, *y.shape[1:]).sum(1) if k > 1 else picked


@torch.library.custom_op("kenotron::sum_copy_rows", mutates_args=())
def sum_copy_rows_op(y: Tensor, dest_row: Tensor, k: int) -> Tensor:
    """sum_token_copies(y, dest_row, k); on CUDA one Triton kernel that reads each row where it is
    (kernels/row_sum.py), summing in fp32 in slot order. For eager callers (a custom op's body):
    it has no derivative."""
    if y.is_cuda and k > 1:
        # optional package: the Triton kernel, loaded on the first CUDA call
        from kenotron.kernels.row_sum import sum_copy_rows

        return sum_copy_rows(y, dest_row, k)
    return sum_token_copies(y, dest_row, k)


@sum_copy_rows_op.register_fake
def _(y: Tensor, dest_row: Tensor, k: int) -> Tensor:
    return y.new_empty((dest_row.shape[0] // k, *y.shape[1:]))


def swiglu_rows(h: Tensor, scale: Tensor) -> Tensor:
    """silu(gate) * up * scale per row, for h = [gate | up] (rows, 2F) and scale (rows,)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up * scale.unsqueeze(-1).to(h.dtype)


@torch.library.custom_op("kenotron::gather_rows_until", mutates_args=())
def gather_rows_until(x: Tensor, src_copy: Tensor, end: Tensor, k: int) -> Tensor:
    """gather_token_rows(x, src_copy, k) on the rows before end[0]; on CUDA the rows from it on
    are left unwritten."""
    if x.is_cuda:
        # optional package: the Triton kernel, loaded on the first CUDA call
        from kenotron.kernels.row_gather import gather_rows_until as kernel

        return kernel(x, src_copy, end, k)
    return gather_token_rows(x, src_copy, k)


@gather_rows_until.register_fake
def _(x: Tensor, src_copy: Tensor, end: Tensor, k: int) -> Tensor:
    return x.new_empty((src_copy.shape[0], *x.shape[1:]))


@torch.library.custom_op("kenotron::expert_swiglu_until", mutates_args=())
def swiglu_rows_until(h: Tensor, scale: Tensor, end: Tensor) -> Tensor:
    """swiglu_rows(h, scale) on the rows before end[0]; on CUDA the rows from it on are left
    unwritten."""
    if h.is_cuda:
        # optional package: the Triton kernel, loaded on the first CUDA call
        from kenotron.kernels.expert_swiglu import expert_swiglu_forward

        return expert_swiglu_forward(h, scale, end)
    return swiglu_rows(h, scale)


@swiglu_rows_until.register_fake
def _(h: Tensor, scale: Tensor, end: Tensor) -> Tensor:
    return h.new_empty((h.shape[0], h.shape[1] // 2))


@torch.library.custom_op("kenotron::expert_swiglu_until_backward", mutates_args=())
def _swiglu_rows_until_backward(grad: Tensor, h: Tensor, scale: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    if h.is_cuda:
        # optional package: the Triton kernel, loaded on the first CUDA call
        from kenotron.kernels.expert_swiglu import expert_swiglu_backward

        return expert_swiglu_backward(grad, h, scale, end)
    # The PyTorch ops' backward, step by step: autograd's own formulas for swiglu_rows, so the
    # CPU values equal those of the rows without the bound.
    gate, up = h.chunk(2, dim=-1)
    silu = F.silu(gate)
    grad_product = grad * scale.unsqueeze(-1).to(h.dtype)
    dscale = (grad * (silu * up)).sum(-1).to(scale.dtype)
    dgate = torch.ops.aten.silu_backward(grad_product * up, gate)
    return torch.cat([dgate, grad_product * silu], dim=-1), dscale


@_swiglu_rows_until_backward.register_fake
def _(grad: Tensor, h: Tensor, scale: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(h), torch.empty_like(scale)


def _swiglu_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _swiglu_autograd(ctx, grad: Tensor):
    h, scale, end = ctx.saved_tensors
    return *_swiglu_rows_until_backward(grad, h, scale, end), None


swiglu_rows_until.register_autograd(_swiglu_autograd, setup_context=_swiglu_setup_context)
