"""parallel/expert_overlap.py: an MoE layer with shared experts whose dispatcher computes them
while the token exchange is in flight gives the same output and gradients, bit for bit, as the
layer adding them after the dispatcher (ep 2, the even split and the deduplicated exchange); the
rows are launched before the shared experts' forward and waited after it, and in backward their
gradient is launched back before the shared experts' backward and waited after it, eager and
compiled (Dynamo with AOTAutograd: the compiled regions are autograd
nodes of their own); and a compiled DeepSeek-V3 block trains at ep 2 as the eager one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from torch import nn

from kenotron.models.common.moe import MoE
from kenotron.models.common.moe_args import MoEArgs
from kenotron.parallel import expert_overlap
from kenotron.parallel.expert import UnevenSplitDispatcher
from kenotron.parallel.expert_even_split import EvenSplitDispatcher
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import run_steps
from tests.parallel.test_compile_experts import _steps_with_dynamo_only

DIM, N_EXPERTS = 16, 8
DISPATCHERS = {"even": EvenSplitDispatcher, "uneven": UnevenSplitDispatcher}


class _SharedAfter:
    """The layer as it was: the dispatcher without the shared experts, their output added after."""

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher

    def __call__(self, x, r, experts, shared=None):
        out = self.dispatcher(x, r, experts)
        return out if shared is None else out + shared(x)


def _layer(shared_gate: bool) -> MoE:
    """An MoE layer with shared experts, the same weights on every rank, each rank holding its
    N_EXPERTS / ep routed experts."""
    ep, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    moe = MoE(DIM, MoEArgs(n_experts=N_EXPERTS, top_k=2, ffn_dim=24, shared_ffn_dim=32, shared_gate=shared_gate))
    for param in moe.parameters():
        nn.init.normal_(param, std=0.3)
    local = slice(rank * N_EXPERTS // ep, (rank + 1) * N_EXPERTS // ep)
    moe.experts.w13 = nn.Parameter(moe.experts.w13.detach()[local].clone())
    moe.experts.w2 = nn.Parameter(moe.experts.w2.detach()[local].clone())
    return moe


def _step(moe: MoE, compiled: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(1 + dist.get_rank())  # each rank its own tokens
    x = torch.randn(2, 6, DIM, requires_grad=True)
    grad_out = torch.randn(2, 6, DIM)
    run = torch.compile(moe, backend="aot_eager") if compiled else moe
    y = run(x)
    (y * grad_out).sum().backward()
    return {"y": y.detach(), "x": x.grad, **{n: p.grad for n, p in moe.named_parameters()}}


def _with_and_without_overlap(kind: str, shared_gate: bool) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for name in ("overlapped", "after"):
        moe = _layer(shared_gate)
        dispatcher = DISPATCHERS[kind](dist.group.WORLD, dist.get_world_size())
        moe.dispatcher = dispatcher if name == "overlapped" else _SharedAfter(dispatcher)
        out[name] = _step(moe, compiled=False)
    return out


@pytest.mark.parametrize("kind,shared_gate", [("even", False), ("uneven", True)],
                         ids=["even-split", "deduplicated-with-shared-gate"])
def test_shared_experts_during_the_exchange_change_no_bit(kind, shared_gate):
    for rank_out in run_on_ranks(2, _with_and_without_overlap, kind, shared_gate):
        overlapped, after = rank_out["overlapped"], rank_out["after"]
        assert overlapped.keys() == after.keys() and "shared_experts.w1.weight" in overlapped
        for key, expected in after.items():
            torch.testing.assert_close(overlapped[key], expected, rtol=0, atol=0, msg=key)


class _Mark(torch.autograd.Function):
    """Identity; its forward appends `forward_label` to `events` (if any), its backward `label`."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, events: list[str], label: str, forward_label: str | None) -> torch.Tensor:
        ctx.events, ctx.label = events, label
        if forward_label is not None:
            events.append(forward_label)
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.events.append(ctx.label)
        return grad, None, None, None


class _MarkedShared:
    """The dispatcher given the shared branch between two marks: its forward's start, its
    backward's start and end."""

    def __init__(self, dispatcher, events: list[str]) -> None:
        self.dispatcher, self.events = dispatcher, events

    def __call__(self, x, r, experts, shared=None):
        @torch._dynamo.disable  # the marks hold a Python list; the shared branch between them compiles
        def mark(t: torch.Tensor, label: str, forward_label: str | None = None) -> torch.Tensor:
            return _Mark.apply(t, self.events, label, forward_label)

        def marked(t: torch.Tensor) -> torch.Tensor:
            return mark(shared(mark(t, "shared backward ends", "shared forward")), "shared backward begins")

        return self.dispatcher(x, r, experts, marked)


def _recorded(method: Callable, events: list[str], label: str) -> staticmethod:
    def run(*args):
        result = method(*args)
        events.append(label)
        return result
    return staticmethod(run)


def _order(kind: str, compiled: bool) -> list[str]:
    """What happened when, in one forward and backward of a layer with shared experts."""
    events: list[str] = []
    launch, finish = expert_overlap._Launch, expert_overlap._Finish
    originals = launch.forward, finish.forward, launch.backward, finish.backward
    launch.forward = _recorded(launch.forward, events, "rows launched")
    finish.forward = _recorded(finish.forward, events, "rows waited")
    launch.backward = _recorded(launch.backward, events, "gradient waited")
    finish.backward = _recorded(finish.backward, events, "gradient launched")
    try:
        moe = _layer(shared_gate=True)
        moe.dispatcher = _MarkedShared(DISPATCHERS[kind](dist.group.WORLD, dist.get_world_size()), events)
        _step(moe, compiled)
    finally:
        launch.forward, finish.forward, launch.backward, finish.backward = originals
    return events


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind", list(DISPATCHERS))
def test_rows_travel_during_the_shared_experts_forward_and_backward(kind, compiled):
    expected = ["rows launched", "shared forward", "rows waited",
                "gradient launched", "shared backward begins", "shared backward ends", "gradient waited"]
    assert run_on_ranks(2, _order, kind, compiled, timeout=300) == [expected] * 2


DEEPSEEK = ["--model.name", "deepseek_v3", "--model.n_layers", "2", "--parallelism.ep", "2",
            "--training.local_batch_size", "4", "--activation_checkpoint.mode", "selective-op"]


def test_compiled_blocks_with_shared_experts_train_at_ep2_as_eager(tmp_path):
    # The block's graph breaks at the exchange's launch and wait (Dynamo only, as
    # test_compile_experts.py runs it); selective recomputation keeps the all-to-alls' outputs.
    eager = run_on_ranks(2, run_steps, DEEPSEEK, str(tmp_path / "eager"), 1)
    compiled = run_on_ranks(2, _steps_with_dynamo_only, [*DEEPSEEK, "--compile.enable", "true"],
                            str(tmp_path / "compiled"), timeout=300)
    assert compiled[0]["dispatchers"] == ["EvenSplitDispatcher"]
    for c, e in zip(compiled, eager):
        torch.testing.assert_close(torch.tensor(c["losses"]), torch.tensor(e["losses"]), rtol=1e-6, atol=0)
