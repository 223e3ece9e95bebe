"""The bounded row gather of the even split's grouped buffer (kernels/row_gather.py) equals the
PyTorch gather before the bound and writes nothing from it on, on the CPU through Triton's
interpreter; on a GPU, in bf16, bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.triton_interpreter import interpreter_job

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("row_gather_child.py")))
def test_bounded_row_gather_equals_index_select_before_the_bound_and_leaves_the_rest(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_bounded_row_gather_on_cuda_equals_index_select_before_the_bound():
    import torch

    from kenotron.kernels.row_gather import gather_rows_until
    from kenotron.models.common.grouped_tail import gather_token_rows

    torch.manual_seed(0)
    tokens, k, rows, end = 4096, 8, 70_000, 40_001
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
    src = torch.randint(0, tokens * k + 1, (rows,), device="cuda")
    src[::5] = tokens * k
    out = gather_rows_until(x, src, torch.tensor([end], dtype=torch.int32, device="cuda"), k)
    torch.testing.assert_close(out[:end], gather_token_rows(x, src, k)[:end], rtol=0, atol=0)
