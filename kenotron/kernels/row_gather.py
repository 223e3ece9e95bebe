"""The experts' row gather that stops at the grouped buffer's last group: out[p] = x[src[p] // k]
for p < end[0] (a zero row where src[p] is `copies`, the padding's mark), rows from end[0] on left
unwritten.

Expert parallel's even split plans its grouped buffer for the worst case (every received slot on
this rank), about twice the rows routing fills; the rows past the last group's end belong to no
expert and nothing reads them (torch._grouped_mm stops at its last offset). PyTorch's index_select
cannot know where that end is without reading it on the host, so it writes every row; this kernel
reads the end on the device. Its users: models/common/grouped_tail.py. Importing it needs `triton`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_ROWS, _BLOCK, _WARPS = 16, 512, 8
"""Rows and columns a program copies, and its warps: the grid is (row blocks, column blocks).
Sixteen rows of 512 columns keep more loads in flight per thread than one row of 1,024 did
(docs/performance.md, "the bounded row gather, sixteen rows a program")."""


@triton.jit
def _gather_kernel(x_ptr, src_ptr, end_ptr, out_ptr, copies, n_rows, dim, K: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_rows = (rows < n_rows) & (rows < tl.load(end_ptr))
    copy = tl.load(src_ptr + rows, mask=in_rows, other=copies)
    live = in_rows[:, None] & (cols < dim)[None, :]
    real = live & (copy < copies)[:, None]  # padding rows name copy `copies`: zeros
    v = tl.load(x_ptr + (copy // K)[:, None] * dim + cols[None, :], mask=real, other=0.0)
    tl.store(out_ptr + rows[:, None] * dim + cols[None, :], v, mask=live)


def gather_rows_until(x: torch.Tensor, src_copy: torch.Tensor, end: torch.Tensor, k: int) -> torch.Tensor:
    """(tokens, dim) -> (len(src_copy), dim): row p is x[src_copy[p] // k], zero where src_copy[p]
    is tokens * k; rows from end[0] (a 1-element int tensor on the device) on are left unwritten."""
    x, src_copy = x.contiguous(), src_copy.contiguous()
    rows = src_copy.shape[0]
    out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dim = math.prod(x.shape[1:])
    if rows and dim:
        grid = (triton.cdiv(rows, _ROWS), triton.cdiv(dim, _BLOCK))
        _gather_kernel[grid](x, src_copy, end, out, x.shape[0] * k, rows, dim, K=k, ROWS=_ROWS, BLOCK=_BLOCK,
                             num_warps=_WARPS)
    return out
