"""Run by test_row_gather.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the bounded row gather against the PyTorch gather, and the rows from the bound on
left as they were. Exits non-zero on a mismatch."""

from __future__ import annotations

import torch

from kenotron.kernels.row_gather import gather_rows_until
from kenotron.models.common.grouped_tail import gather_token_rows
from tests.kernels.sentinel_outputs import SENTINEL, outputs_start_as_sentinel


def check(tokens: int, dim: tuple[int, ...], k: int, rows: int, end: int) -> None:
    x = torch.randn(tokens, *dim, dtype=torch.float64)
    copies = tokens * k
    src = torch.randint(0, copies + 1, (rows,))  # copies: a padding row
    src[::4] = copies
    bound = torch.tensor([end], dtype=torch.int32)
    with outputs_start_as_sentinel():
        out = gather_rows_until(x, src, bound, k)
    ref = gather_token_rows(x, src, k)
    torch.testing.assert_close(out[:end], ref[:end], rtol=0, atol=0)
    assert bool((out[end:] == SENTINEL).all()), "rows from the bound on were written"


check(5, (12,), 3, 20, 11)       # some rows past the bound
check(5, (12,), 3, 20, 20)       # the bound at the end: every row
check(4, (1500,), 2, 9, 6)       # a row wider than one program's 512 columns
check(3, (2, 5), 1, 7, 0)        # rows of two dims; nothing before the bound
print("ok")
