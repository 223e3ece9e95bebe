"""The per-token sum of k expert rows read where they lie (kernels/row_sum.py) equals the same sum
in slot order and PyTorch's index_select-and-sum, on the CPU through Triton's interpreter; on a
GPU, in bf16, bit for bit against the fp32 sum in slot order and within bf16 rounding of PyTorch's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.triton_interpreter import interpreter_job

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("row_sum_child.py")))
def test_row_sum_equals_the_slot_order_sum_and_pytorchs(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_row_sum_on_cuda_equals_the_slot_order_sum_and_pytorchs_within_bf16_rounding():
    import torch

    from kenotron.models.common.grouped_tail import sum_copy_rows_op, sum_token_copies

    torch.manual_seed(0)
    rows, tokens, k = 70_001, 8192, 8
    y = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
    dest = torch.randint(0, rows, (tokens * k,), device="cuda")
    dest[::2] = rows - 1
    out = sum_copy_rows_op(y, dest, k)
    acc = torch.zeros(tokens, 2048, device="cuda")
    for part in y.index_select(0, dest).view(tokens, k, 2048).unbind(1):
        acc += part.float()
    torch.testing.assert_close(out, acc.to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(out, sum_token_copies(y, dest, k), rtol=1.6e-2, atol=1e-2)
