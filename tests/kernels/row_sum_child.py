"""Run by test_row_sum.py in a child process with TRITON_INTERPRET=1 (Triton's CPU interpreter):
the per-token sum of k rows against the same sum in slot order, and against PyTorch's
index_select-and-sum. Exits non-zero on a mismatch."""

from __future__ import annotations

import torch

from kenotron.kernels.row_sum import sum_copy_rows
from kenotron.models.common.grouped_tail import sum_token_copies


def check(rows: int, dim: tuple[int, ...], k: int, tokens: int, dtype: torch.dtype) -> None:
    y = torch.randn(rows, *dim, dtype=dtype)
    dest = torch.randint(0, rows, (tokens * k,))
    dest[::3] = rows - 1  # many slots on one row, as the even split's zero row
    out = sum_copy_rows(y, dest, k)
    in_order = y.index_select(0, dest).view(tokens, k, *dim).unbind(1)
    acc = torch.zeros_like(in_order[0], dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    for part in in_order:  # the kernel's arithmetic: fp32 (fp64) in slot order
        acc += part.to(acc.dtype)
    torch.testing.assert_close(out, acc.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(out, sum_token_copies(y, dest, k), rtol=1e-6, atol=1e-6)


check(20, (12,), 3, 5, torch.float32)
check(9, (1500,), 2, 4, torch.float32)      # a row wider than one program's 512 columns
check(40, (2, 5), 8, 17, torch.float64)     # rows of two dims; more tokens than one program's 16
check(7, (33,), 1, 6, torch.float32)        # k = 1: a plain gather
print("ok")
