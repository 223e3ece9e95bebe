"""ZeRO-1: optimizer state sharded over the data-parallel ranks, parameters and gradients whole.

The ranks are those of the mesh it is given: dp, or dp x cp under context parallel (the cp
ranks hold the same parameters; kenotron/parallel/data_parallel.py).

Each rank owns a subset of the parameters (a greedy partition balancing element counts) and
keeps AdamW state only for those. After gradients are all-reduced (DDP), every rank steps
its own parameters and the owners broadcast the new values, coalesced per owner. Per-rank
optimizer state is then about 1/dp of the whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh

from kenotron.dtensor import local_tensor


def partition_params(params: list[torch.nn.Parameter], world: int) -> list[int]:
    """Owner rank of each parameter: largest first, each to the least-loaded rank."""
    load = [0] * world
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class Zero1Optimizer:
    """Wraps an optimizer class so that each dp rank holds state for its own parameters only.

    `inner` is a real torch optimizer over the owned parameters (an LR scheduler attaches
    to it); `param_groups` keep their hyper-parameters for every rank.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        dp_mesh: DeviceMesh,
        optimizer_factory: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
    ) -> None:
        self.dp_group = dp_mesh.get_group()
        self.dp_size = dp_mesh.size()
        self.dp_rank = dp_mesh.get_local_rank()
        self.all_params = [p for g in param_groups for p in g["params"]]
        owner = partition_params(self.all_params, self.dp_size)
        self.owner = {id(p): r for p, r in zip(self.all_params, owner)}
        owned_groups = []
        for g in param_groups:
            mine = [p for p in g["params"] if self.owner[id(p)] == self.dp_rank]
            owned_groups.append({**g, "params": mine})
        # torch optimizers refuse an empty parameter list; a rank owning nothing keeps a dummy.
        if not any(g["params"] for g in owned_groups):
            owned_groups[0]["params"] = [torch.nn.Parameter(torch.zeros(0, device=self.all_params[0].device))]
        self.inner = optimizer_factory(owned_groups)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.all_params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        for rank in range(self.dp_size):
            mine = [local_tensor(p) for p in self.all_params if self.owner[id(p)] == rank]
            if not mine:
                continue
            src = dist.get_global_rank(self.dp_group, rank)
            for dtype in {t.dtype for t in mine}:
                tensors = [t for t in mine if t.dtype == dtype]
                flat = _flatten_dense_tensors(tensors)
                dist.broadcast(flat, src=src, group=self.dp_group)
                if rank != self.dp_rank:
                    for t, new in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                        t.copy_(new)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
