"""The experts' row gathers in Triton: the gather that stops at the grouped buffer's last group,
out[p] = x[src[p] // k] for p < end[0] (a zero row where src[p] is `copies`, the padding's mark),
rows from end[0] on left unwritten; and each token's sum of its k grouped rows,
out[t] = sum_j y[dest[t * k + j]], without the (tokens * k, dim) gathered rows in between.

Expert parallel's even split plans its grouped buffer for the worst case (every received slot on
this rank), about twice the rows routing fills; the rows past the last group's end belong to no
expert and nothing reads them (torch._grouped_mm stops at its last offset). PyTorch's index_select
cannot know where that end is without reading it on the host, so it writes every row; this kernel
reads the end on the device. The sum of rows is the first product's backward (its rows' gradient),
which runs outside compiled code (inside a custom op): PyTorch would write the k gathered rows of
every token and read them back to sum them. Its users: models/common/grouped_tail.py. Importing
it needs `triton`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_BLOCK = 1024
"""Columns a program copies: the grid is (rows, column blocks)."""


@triton.jit
def _gather_kernel(x_ptr, src_ptr, end_ptr, out_ptr, copies, dim, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    copy = tl.load(src_ptr + row)
    # Masks compared as vectors: Triton's interpreter rejects a scalar mask and'ed with a vector.
    live = (cols < dim) & (row + 0 * cols < tl.load(end_ptr))
    real = live & (copy + 0 * cols < copies)  # padding rows name copy `copies`: zeros
    v = tl.load(x_ptr + (copy // K) * dim + cols, mask=real, other=0.0)
    tl.store(out_ptr + row * dim + cols, v, mask=live)


def gather_rows_until(x: torch.Tensor, src_copy: torch.Tensor, end: torch.Tensor, k: int) -> torch.Tensor:
    """(tokens, dim) -> (len(src_copy), dim): row p is x[src_copy[p] // k], zero where src_copy[p]
    is tokens * k; rows from end[0] (a 1-element int tensor on the device) on are left unwritten."""
    x, src_copy = x.contiguous(), src_copy.contiguous()
    rows = src_copy.shape[0]
    out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dim = math.prod(x.shape[1:])
    if rows and dim:
        _gather_kernel[(rows, triton.cdiv(dim, _BLOCK))](x, src_copy, end, out, x.shape[0] * k, dim, K=k, BLOCK=_BLOCK)
    return out


@triton.jit
def _sum_kernel(y_ptr, dest_ptr, out_ptr, dim, K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < dim
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):  # in slot order, accumulated in fp32, rounded once
        row = tl.load(dest_ptr + token * K + j)
        acc += tl.load(y_ptr + row * dim + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * dim + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def sum_token_rows(y: torch.Tensor, dest_row: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, dim) -> (len(dest_row) // k, dim): token t the sum of rows dest_row[t*k : (t+1)*k]."""
    y, dest_row = y.contiguous(), dest_row.contiguous()
    tokens = dest_row.shape[0] // k
    out = torch.empty((tokens, *y.shape[1:]), dtype=y.dtype, device=y.device)
    dim = math.prod(y.shape[1:])
    if tokens and dim:
        _sum_kernel[(tokens, triton.cdiv(dim, _BLOCK))](y, dest_row, out, dim, K=k, BLOCK=_BLOCK)
    return out
