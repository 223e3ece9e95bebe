"""The sum of each token's k expert rows, read where they lie: out[t] = y[dest[t*k]] + ... +
y[dest[t*k + k - 1]], accumulated in fp32 in slot order and written in y's dtype.

PyTorch's form (index_select the T*k rows out, then sum each token's k) writes and reads the k
rows once more: in the backward of the experts' first product under expert parallel (the product's
rows' gradient summed per token, models/common/experts.py) the copy and its sum took 4.0 ms of
DeepSeek-V3's EP 2 step, this kernel 0.8 (docs/performance.md, "the first product's backward sums
each token's rows where they lie"). Its users: models/common/grouped_tail.py. Importing it needs `triton`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_ROWS, _BLOCK, _WARPS = 16, 512, 8
"""Tokens and columns a program sums, and its warps (the row gather's shape, kernels/row_gather.py)."""


@triton.jit
def _sum_kernel(y_ptr, dest_ptr, out_ptr, tokens, dim, K: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                ACC: tl.constexpr):
    toks = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live_toks = toks < tokens
    live = live_toks[:, None] & (cols < dim)[None, :]
    acc = tl.zeros((ROWS, BLOCK), dtype=ACC)
    for j in tl.static_range(K):
        row = tl.load(dest_ptr + toks * K + j, mask=live_toks, other=0)
        acc += tl.load(y_ptr + row[:, None] * dim + cols[None, :], mask=live, other=0.0).to(ACC)
    tl.store(out_ptr + toks[:, None] * dim + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=live)


def sum_copy_rows(y: torch.Tensor, dest_row: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, ...) -> (len(dest_row) // k, ...): token t the sum of y's rows dest_row[t*k:(t+1)*k],
    in fp32 (fp64 for fp64 rows) in slot order."""
    y, dest_row = y.contiguous(), dest_row.contiguous()
    tokens = dest_row.shape[0] // k
    out = torch.empty((tokens, *y.shape[1:]), dtype=y.dtype, device=y.device)
    dim = math.prod(y.shape[1:])
    if tokens and dim:
        acc = tl.float64 if y.dtype == torch.float64 else tl.float32
        grid = (triton.cdiv(tokens, _ROWS), triton.cdiv(dim, _BLOCK))
        _sum_kernel[grid](y, dest_row, out, tokens, dim, K=k, ROWS=_ROWS, BLOCK=_BLOCK, ACC=acc, num_warps=_WARPS)
    return out
