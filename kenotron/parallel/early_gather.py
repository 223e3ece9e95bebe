"""Start a step's first FSDP all-gathers under the previous step's optimizer update.

A training step's forward begins with the all-gathers of the root unit (embedding, final norm,
output) and of the first block, and nothing else is queued to hide them behind: the GPU waits
for them every step (docs/performance.md). Their parameters are updated in an optimizer step of
their own, then their all-gathers are issued (`FSDPModule.unshard(async_op=True)`, which the
forward waits on) while the optimizer updates every other parameter.

Each parameter's update is independent of the others' (AdamW, SGD, per-tensor state and step
count), so two `step()` calls over disjoint sets of parameters give the values of one. Until the
forward, the units' parameters stay sharded as the module sees them (state dicts and checkpoints
read the sharded values).

After the last step no forward comes to wait for those all-gathers: `finish()` waits for them
and reshards. Left in flight, a gloo all-gather may complete while the interpreter shuts down,
and its completion then aborts the process (SIGABRT, "terminate called without an active
exception").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule


class EarlyGather:
    """`step(optimizer)` in place of `optimizer.step()` for a model wrapped by FSDP per block."""

    def __init__(self, model: nn.Module) -> None:
        units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
        if not isinstance(model, FSDPModule) or not units:
            raise ValueError("EarlyGather needs a root FSDP module with at least one FSDP block")
        self.model = model
        self.units: list[FSDPModule] = [model, units[0]]  # the root, then the block the forward meets first
        inner = {id(p) for unit in units for p in unit.parameters()}
        self._first = {id(p) for p in model.parameters() if id(p) not in inner}
        self._first |= {id(p) for p in units[0].parameters()}
        self._handles: list = []  # the all-gathers started by the last step()

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer) -> None:
        with_grad = [p for p in self.model.parameters() if p.grad is not None]
        first = [p for p in with_grad if id(p) in self._first]
        rest = [p for p in with_grad if id(p) not in self._first]
        self._step_only(optimizer, first, rest)
        # The forward waits on these; only the latest step's are pending (finish() after the last one).
        self._handles = [unit.unshard(async_op=True) for unit in self.units]
        self._step_only(optimizer, rest, first)

    def finish(self) -> None:
        """Wait for the all-gathers started by the last step and reshard (no forward follows)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            if handle is not None:
                handle.wait()
        if handles:
            for unit in self.units:
                unit.reshard()

    @staticmethod
    def _step_only(optimizer: torch.optim.Optimizer, params: list, others: list) -> None:
        """One optimizer step over `params`: the others' gradients are set aside (an optimizer skips
        a parameter without one) and put back after."""
        held = [p.grad for p in others]
        for p in others:
            p.grad = None
        try:
            if params:
                optimizer.step()
        finally:
            for p, grad in zip(others, held, strict=True):
                p.grad = grad
