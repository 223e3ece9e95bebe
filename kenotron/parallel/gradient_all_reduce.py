"""DDP without FSDP's machinery: plain parameters, each gradient all-reduced in place once it is final.

`replicate_with_fsdp` (the default DDP engine) runs FSDP's per-unit machinery over a 1-way shard:
every step it casts each fp32 parameter into a bf16 copy, and after backward concatenates each
unit's bf16 gradients into a flat fp32 buffer (a cast copy), copies that buffer once more (its
1-rank "reduce-scatter"), all-reduces it in fp32 (twice the bytes of the bf16 gradients) and
keeps fp32 gradients, so the optimizer runs on fp32 weights (docs/parallelism.md, "DDP engines").

Here the model stays as one GPU trains it (its precision is the single-device one: bf16
parameters with fp32 masters in the optimizer on CUDA, else autocast), and a post-accumulate-
grad hook on each parameter launches an asynchronous all-reduce of its gradient, in place and in
the gradient's own dtype, as soon as autograd has finished accumulating it: the all-reduces run
under the rest of backward, and nothing is copied. A callback queued at the end of backward waits
for them (on CUDA: the compute stream waits on the communication stream; the host does not block).

Gradient accumulation: `sync = False` on the micro-steps before the last, which then accumulate
locally; the last micro-step's hooks reduce the accumulated gradients, once per step. Every rank
must use the same parameters in a backward (as every dense model does): the all-reduces are
issued in the order their gradients become final, which is then the same on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from kenotron.dtensor import local_tensor


class GradientAllReduce:
    """Averages the gradients of `model` over `mesh` (1-D) after each synced backward."""

    def __init__(self, model: nn.Module, mesh: DeviceMesh) -> None:
        self.group = mesh.get_group()
        self.size = mesh.size()
        self.sync = True
        """False on micro-steps whose gradients only accumulate (set by DataParallelState.set_microstep)."""
        self._params: list[nn.Parameter] = []
        # The hooks go on the parameters the first forward meets: building the job replaces the
        # meta parameters wrapped here with new objects (to_empty), which would drop them.
        self._attach_handle = model.register_forward_pre_hook(self._attach)
        self._in_flight: list[tuple[torch.Tensor, dist.Work]] = []
        self._reduced: set[int] = set()
        self._callback_queued = False

    def _attach(self, model: nn.Module, args: object) -> None:
        seen: set[int] = set()
        for p in model.parameters():  # tied parameters once: one hook fires after both uses
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params.append(p)
                p.register_post_accumulate_grad_hook(self._on_final_gradient)
        self._attach_handle.remove()

    def _on_final_gradient(self, param: nn.Parameter) -> None:
        if not self.sync:
            return
        if not self._callback_queued:
            # Runs once autograd has finished this backward, before backward() returns.
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._callback_queued = True
        self._launch(param)

    def _launch(self, param: nn.Parameter) -> None:
        grad = local_tensor(param.grad)
        # NCCL (CUDA tensors) averages natively; gloo has no AVG, so it sums and _finish divides.
        op = dist.ReduceOp.AVG if grad.device.type == "cuda" else dist.ReduceOp.SUM
        self._in_flight.append((grad, dist.all_reduce(grad, op=op, group=self.group, async_op=True)))
        self._reduced.add(id(param))

    def _finish(self) -> None:
        # A parameter whose hook did not fire (its gradient came from outside autograd's
        # accumulation, or it got none this step) is reduced here, in model order.
        for p in self._params:
            if id(p) not in self._reduced and p.grad is not None:
                self._launch(p)
        for grad, work in self._in_flight:
            work.wait()
            if grad.device.type != "cuda":
                grad.div_(self.size)
        self._in_flight.clear()
        self._reduced.clear()
        self._callback_queued = False
