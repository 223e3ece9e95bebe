"""models/common/grouped_tail.py: the row gathers and the gate that stop at the grouped buffer's
last group. The ops pass torch.library's checks; the even split's experts run through them
(forward and backward) and give the values and gradients of the same experts over the whole
buffer: exactly on the CPU (the PyTorch ops), within bf16 rounding on a GPU (the Triton kernels,
which compute in fp32), eager and compiled."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kenotron.models.common.experts import GroupedExperts, copy_weights, sum_rows
from kenotron.models.common.grouped_tail import gather_rows_until, swiglu_rows_until
from kenotron.parallel.expert_even_split import even_split_grouping

DIM, FFN, LOCAL, K = 64, 96, 4, 3


def test_bounded_ops_pass_torch_library_opcheck():
    torch.manual_seed(0)
    end = torch.tensor([5], dtype=torch.int32)
    torch.library.opcheck(gather_rows_until, (torch.randn(4, 6), torch.tensor([0, 11, 12, 3, 7, 12, 1]), end, 3))
    h, scale = torch.randn(7, 8, requires_grad=True), torch.rand(7, requires_grad=True)
    torch.library.opcheck(swiglu_rows_until, (h, scale, end))


class _Ops(TorchDispatchMode):
    """Each op dispatched and the shape of its (first) output."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        self.calls.append((func._schema.name, tuple(first.shape) if isinstance(first, torch.Tensor) else ()))
        return out


def _layer(device: str, dtype: torch.dtype, received: int = 40):
    """Even-split experts on `received` rows with random slots (id LOCAL: another rank's expert),
    and the step that runs them: grouping -> (output, gradients of the rows, routing weights and
    weights)."""
    torch.manual_seed(0)
    experts = GroupedExperts(DIM, FFN, LOCAL)
    experts.kernel = "grouped_mm"
    with torch.no_grad():
        experts.w13.normal_(0, 0.2)
        experts.w2.normal_(0, 0.2)
    experts = experts.to(device, dtype)
    x = torch.randn(received, DIM, device=device, dtype=dtype)
    weights = torch.rand(received, K, device=device)
    grad = torch.randn(received, DIM, device=device, dtype=dtype)
    ids = torch.randint(0, LOCAL + 1, (received, K), device=device)
    g = even_split_grouping(ids, LOCAL, align=8)

    def step(g, compiled: bool = False) -> list[torch.Tensor]:
        xx, ww = x.clone().requires_grad_(), weights.clone().requires_grad_()

        def layer(xx, ww):
            return sum_rows(experts(xx, g.offsets, g.counts, copy_weights(ww, g), gather=g), g)

        for p in experts.parameters():
            p.grad = None
        out = (torch.compile(layer, fullgraph=True) if compiled else layer)(xx, ww)
        out.backward(grad)
        return [out, xx.grad, ww.grad, experts.w13.grad, experts.w2.grad]

    return g, step


def test_even_split_experts_gather_and_gate_through_the_bounded_ops():
    g, step = _layer("cpu", torch.float32)
    assert int(g.end) < g.rows  # a tail of rows in no group
    with _Ops() as ops:
        step(g)
    names = [name for name, _ in ops.calls]
    # Forward's gather runs inside the first product's op, and so does its backward's; sum_rows'
    # backward gathers through the bounded op itself.
    assert "kenotron::gather_grouped_mm" in names and "kenotron::gather_grouped_mm_backward" in names
    assert names.count("kenotron::gather_rows_until") == 1
    assert names.count("kenotron::expert_swiglu_until") == names.count("kenotron::expert_swiglu_until_backward") == 1
    # No PyTorch gather or gate over the whole grouped buffer (rows, DIM) or (rows, FFN) is left.
    whole = [(name, shape) for name, shape in ops.calls
             if shape[:1] == (g.rows,) and len(shape) == 2 and not name.startswith(("kenotron::", "aten::_grouped_mm"))]
    assert not whole, whole


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                        reason="needs a CUDA GPU with torch._grouped_mm in bf16")])])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_even_split_experts_stopping_at_the_last_group_equal_the_whole_buffer(device, compiled):
    if device == "cpu" and compiled:
        pytest.skip("inductor's code generation takes minutes on two CPU cores; the GPU row compiles")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g, step = _layer(device, dtype, received=4096 if device == "cuda" else 40)
    bounded = step(g, compiled)
    whole = step(dataclasses.replace(g, end=None), compiled)
    for name, a, b in zip(("out", "rows", "routing weights", "w13", "w2"), bounded, whole):
        if device == "cpu":
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        else:  # the kernels round once from fp32, the PyTorch ops after each bf16 op (measured: <= 0.6% of the largest)
            worst, largest = (a.float() - b.float()).abs().max().item(), b.float().abs().max().item()
            assert worst <= 1.5e-2 * largest, (name, worst, largest)
