"""Expert parallel's dispatch exchange with the shared experts computed while it is in flight.

An MoE layer with shared experts (DeepSeek-V3, Qwen2-MoE) sends its token rows to the ranks that
hold their routed experts (an all-to-all), computes those experts, and adds the shared experts'
output, which needs no exchange. Computed after the dispatcher, the shared experts ran while
nothing was in flight, and the dispatch all-to-all sat alone on the critical path (GPU traces of
DeepSeek-V3 16B at ep 4: 0.5-1.3 ms a layer exposed, about 8% of the step, beside shared experts
of about 1 ms forward and 2 ms backward). `dispatch_rows` computes them between the launch of the
exchange and the first use of the rows received, in both directions:

- forward: the rows, their routing weights and their expert ids leave as functional collectives
  (each waited at its first use, not at launch; the ids' c10d all-to-all would make the compute
  stream wait at once), then the shared branch runs, then `_Finish` waits for the rows.
- backward: torch's all-to-all backward waits as soon as it launches, and the autograd engine
  runs, of the nodes ready, the one created last first. So the rows travel through two Functions
  instead: `_Launch` (created before the shared branch) and `_Finish` (after it). The routed path
  (created after `_Finish`) runs its backward first; `_Finish`'s backward then launches the
  received rows' gradient back without waiting; the shared branch's nodes, created between the
  two, come next; `_Launch`'s backward waits last. The weights' all-to-all is created before the
  shared branch too: its backward waits right away, on the same communication stream as the
  rows' gradient, so it must run after the shared branch, not before.

Under torch.compile the two steps are left out of the graphs (`torch._dynamo.disable`): a traced
functional collective is waited right after its launch in the graph, and a compiled region is one
autograd node, which would put the shared branch's backward before or after the whole exchange.
With the graph broken at both, the shared branch is a compiled region of its own, created between
them, and keeps its place in both directions. Layers without shared experts keep the plain
exchange and their graphs whole.

The math is the same either way: the same collectives move the same rows, and the shared
branch's output is added to the routed one where the layer added it before (`MoE.forward`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import (
    AsyncCollectiveTensor,
    all_to_all_single,
    all_to_all_single_autograd,
)


@dataclass
class Received:
    """What a rank receives of the dispatch: the rows, their routing weights and expert ids, and
    the shared branch's output on this rank's own tokens (None without shared experts)."""

    rows: torch.Tensor
    weights: torch.Tensor
    ids: torch.Tensor
    shared: torch.Tensor | None


@dataclass
class _InFlight:
    """One dispatch's exchange between its launch and its wait, in either direction; `_Launch`
    and `_Finish` of one dispatch share it."""

    group: dist.ProcessGroup
    send_splits: list[int] | None
    recv_splits: list[int] | None
    rows: torch.Tensor | None = None
    """Forward: the rows on their way here (an AsyncCollectiveTensor until `_Finish` waits)."""
    grad: torch.Tensor | None = None
    """Backward: their gradient on its way back (until `_Launch` waits)."""


def _waited(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, AsyncCollectiveTensor) else t


class _Launch(torch.autograd.Function):
    """Forward: launches the rows' all-to-all, returns an empty tensor that ties `_Finish` to it.
    Backward: waits for their gradient (`_Finish`'s backward launched it)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, flight: _InFlight) -> torch.Tensor:
        ctx.flight = flight
        flight.rows = all_to_all_single(rows.contiguous(), flight.recv_splits, flight.send_splits, flight.group)
        return rows.new_empty(0)

    @staticmethod
    def backward(ctx, _tie: torch.Tensor):
        flight = ctx.flight
        grad, flight.grad = flight.grad, None
        return _waited(grad), None


class _Finish(torch.autograd.Function):
    """Forward: waits for the rows. Backward: launches their gradient back, without waiting."""

    @staticmethod
    def forward(ctx, tie: torch.Tensor, flight: _InFlight) -> torch.Tensor:
        ctx.flight = flight
        rows, flight.rows = flight.rows, None
        return _waited(rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flight = ctx.flight
        flight.grad = all_to_all_single(grad.contiguous(), flight.send_splits, flight.recv_splits, flight.group)
        return grad.new_empty(0), None


@torch._dynamo.disable(reason="holds collectives in flight across autograd nodes (module docstring)")
def _launch(rows: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, flight: _InFlight
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three all-to-alls launched, rows first: (the rows' tie, weights, ids), the last two
    waited at their first use."""
    tie = _Launch.apply(rows, flight)
    recv_w = all_to_all_single_autograd(weights, flight.recv_splits, flight.send_splits, flight.group)
    recv_ids = all_to_all_single(ids, flight.recv_splits, flight.send_splits, flight.group)
    return tie, recv_w, recv_ids


@torch._dynamo.disable(reason="holds collectives in flight across autograd nodes (module docstring)")
def _finish(tie: torch.Tensor, flight: _InFlight) -> torch.Tensor:
    return _Finish.apply(tie, flight)


def dispatch_rows(rows: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, send_splits: list[int] | None,
                  recv_splits: list[int] | None, group: dist.ProcessGroup,
                  shared: Callable[[], torch.Tensor] | None = None) -> Received:
    """The dispatch all-to-all of `rows` (autograd), `weights` (autograd) and `ids` (none) with
    these splits (None: even), and `shared()` computed while it is in flight (module docstring)."""
    if shared is None:
        return Received(all_to_all_single_autograd(rows, recv_splits, send_splits, group),
                        all_to_all_single_autograd(weights, recv_splits, send_splits, group),
                        all_to_all_single(ids, recv_splits, send_splits, group), None)
    flight = _InFlight(group, send_splits, recv_splits)
    tie, recv_w, recv_ids = _launch(rows, weights, ids, flight)
    shared_out = shared()
    return Received(_finish(tie, flight), recv_w, recv_ids, shared_out)
