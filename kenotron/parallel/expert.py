"""MoE layers on a mesh: expert parallelism, and tensor parallelism around the MoE layers.

For every module of a plan's `layout.moe_modules` (models/common/moe.py):

- Expert parallel (an "ep" mesh dimension, borrowed from dp_shard x cp; parallel/dims.py):
  the expert weights become DTensors sharded over ep on the expert dimension (each rank holds
  n_experts / ep experts), and the layer's dispatcher becomes `AllToAllDispatcher`: each rank
  groups its token copies by expert, sends each rank the copies of its experts (the copy counts
  are exchanged first, so the splits may be uneven), computes what it received, and sends the
  results back. FSDP then shards the expert weights over the data-parallel ranks ep leaves
  ("efsdp", parallel/data_parallel.py).
- Tensor parallel (a "tp" dimension): the MoE layer has no tensor-parallel split. It runs on
  this rank's shard of the sequence (under sequence parallel the residual stream is split
  already; without, its input is sliced and its output gathered), with every weight replicated
  over tp. Each tp rank thus routes other tokens: the weights' gradients are partial sums,
  summed over tp by the gradient reduction (FSDP's, or `reduce_partial_grads_` before clipping).
- Load balancing: the router counts a micro-batch's routing over every rank that holds other
  tokens of it (the "dp_cp_tp" view).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

from kenotron.models.common.experts import GroupedExperts, gather_rows, group_by_expert, sum_rows
from kenotron.models.common.moe import MoE, expert_alignment
from kenotron.models.common.router import RouterOutput
from kenotron.parallel.dims import Meshes
from kenotron.parallel.model_layout import ModelLayout, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings

SEQ = Shard(1)


class AllToAllDispatcher:
    """The expert-parallel dispatcher: token copies travel to the rank of their expert and back."""

    def __init__(self, group: dist.ProcessGroup, ep: int) -> None:
        self.group, self.ep = group, ep
        self.assume_balanced = False
        """Take every split as even instead of exchanging the counts: the memory estimator's
        planning, on fake tensors whose values do not exist (the trainer never sets it)."""

    def _splits(self, counts: torch.Tensor, copies: int) -> tuple[torch.Tensor, list[int], list[int]]:
        """(copies received per [source rank, local expert], copies sent per rank, received per rank)."""
        if self.assume_balanced:
            even = [copies // self.ep] * self.ep
            return torch.full_like(counts, copies // counts.shape[0]), even, even
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        local = counts.shape[0] // self.ep
        return received, counts.view(self.ep, local).sum(1).tolist(), received.view(self.ep, local).sum(1).tolist()

    def __call__(self, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts) -> torch.Tensor:
        n_experts, k = experts.n_experts, r.experts.shape[1]
        local = n_experts // self.ep
        by_expert = group_by_expert(r.experts.reshape(-1), n_experts, k)
        send = gather_rows(x, by_expert)  # copies ordered by expert, hence by destination rank
        received, send_splits, recv_splits = self._splits(by_expert.counts, by_expert.copies)
        recv = all_to_all_single_autograd(send, recv_splits, send_splits, self.group)
        # Regroup what arrived (source-major) by local expert, padded for the expert kernel.
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=x.device).repeat(self.ep), received.view(-1), output_size=sum(recv_splits))
        g = group_by_expert(expert_of_row, local, 1, expert_alignment(experts, x))
        ones = torch.ones(g.rows, device=x.device)
        y = sum_rows(experts(gather_rows(recv, g), g.offsets, g.counts, ones), g)
        back = all_to_all_single_autograd(y, send_splits, recv_splits, self.group)
        # The routing weights apply on this side, per copy, before each token sums its copies.
        weights = r.weights.reshape(-1).index_select(0, by_expert.src_copy)
        return sum_rows(back * weights.unsqueeze(-1).to(back.dtype), by_expert)


def _replicated_over_tp(tensor: torch.Tensor, mesh: DeviceMesh, placements: list) -> nn.Parameter:
    return nn.Parameter(distribute_tensor(tensor.detach(), mesh, placements, src_data_rank=None))


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def _local_view(grad_placements: tuple, grad_scale: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """How compute reads a DTensor weight: its local shard, whose gradient has `grad_placements`
    (Partial on tp: each tp rank computed with other tokens), times `grad_scale`."""

    def view(weight: torch.Tensor) -> torch.Tensor:
        local = weight.to_local(grad_placements=grad_placements) if isinstance(weight, DTensor) else weight
        return _ScaleGrad.apply(local, grad_scale) if grad_scale != 1.0 else local

    return view


def _linear_on_local_weight(linear: nn.Linear, view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, view(linear.weight), None if linear.bias is None else view(linear.bias))

    linear.forward = forward  # type: ignore[method-assign]


def apply_expert_parallel(model: nn.Module, meshes: Meshes, layout: ModelLayout, settings: ParallelSettings) -> None:
    """A plan's EP step: every MoE layer of `model` on the ep and tp dimensions (see the module docstring)."""
    pattern = layout.moe_modules
    if not pattern:
        return
    ep_mesh, tp_mesh = meshes.get("ep"), meshes.get("tp")
    tokens = meshes.get("dp_cp_tp")
    for name, moe in matching_modules(model, pattern):
        if not isinstance(moe, MoE):
            raise TypeError(f"plan.layout.moe_modules names {name!r}, a {type(moe).__name__}, not an MoE layer")
        if tokens is not None:
            moe.router.balance.group, moe.router.balance.group_size = tokens.get_group(), tokens.size()
        experts = moe.experts
        if ep_mesh is not None or tp_mesh is not None:
            dims = [m for m in ("ep", "tp") if meshes.get(m) is not None]
            mesh = meshes.root[tuple(dims)] if len(dims) > 1 else meshes.get(dims[0])
            placements = [Shard(0) if d == "ep" else Replicate() for d in dims]
            for pname in ("w13", "w2"):
                setattr(experts, pname, _replicated_over_tp(getattr(experts, pname), mesh, placements))
            # Each expert's gradient gathers the tokens of its ep group: the step's loss is scaled by
            # the data-parallel averaging size (dp_shard x cp x dp_replicate), while FSDP averages
            # the experts over 1/ep of those ranks; 1/ep makes the average the mean over all.
            grad_scale = 1.0 / ep_mesh.size() if ep_mesh is not None else 1.0
            experts.weight_view = _local_view(tuple(Shard(0) if d == "ep" else Partial() for d in dims), grad_scale)
        if ep_mesh is not None:
            if experts.n_experts % ep_mesh.size():
                raise ValueError(f"ep={ep_mesh.size()} does not divide the {experts.n_experts} experts of {name}")
            moe.dispatcher = AllToAllDispatcher(ep_mesh.get_group(), ep_mesh.size())
        if tp_mesh is not None:
            _replicate_over_tp(moe, tp_mesh, settings.sequence_parallel)


def _replicate_over_tp(moe: MoE, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """The layer's other weights replicated over tp (partial gradients); it runs on this rank's
    sequence shard."""
    view = _local_view((Partial(),))
    for module in moe.modules():
        if isinstance(module, nn.Linear):
            module.weight = _replicated_over_tp(module.weight, tp_mesh, [Replicate()])
            if module.bias is not None:
                module.bias = _replicated_over_tp(module.bias, tp_mesh, [Replicate()])
            _linear_on_local_weight(module, view)
    parallelize_module(moe, tp_mesh, PrepareModuleInput(
        input_layouts=(SEQ if sequence_parallel else Replicate(),), desired_input_layouts=(SEQ,),
        use_local_output=True,
    ))
    if not sequence_parallel:
        parallelize_module(moe, tp_mesh, PrepareModuleOutput(
            output_layouts=SEQ, desired_output_layouts=Replicate(), use_local_output=True,
        ))
