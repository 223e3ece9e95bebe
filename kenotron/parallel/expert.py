"""MoE layers on a mesh: expert parallelism, and tensor parallelism around the MoE layers.

For every module of a plan's `layout.moe_modules` (models/common/moe.py):

- Expert parallel (an "ep" mesh dimension, borrowed from dp_shard x cp; parallel/dims.py):
  the expert weights become DTensors sharded over ep on the expert dimension (each rank holds
  n_experts / ep experts), and the layer's dispatcher exchanges the tokens. At ep 2,
  `EvenSplitDispatcher`: every token to every rank of the group, nothing read on the host
  (parallel/expert_even_split.py). Above, where its worst-case buffers cost more than a host read
  (and for float8 experts or a sparse routing), `UnevenSplitDispatcher`: each token travels once
  to each rank that holds one of its experts, the row counts exchanged first and read on the host
  (parallel/expert_dispatch.py); `pays_without_host_read` chooses. Either way the receiver
  computes its experts, weights and sums them, and sends one row back. FSDP then shards the
  expert weights over the data-parallel ranks ep leaves ("efsdp", parallel/data_parallel.py);
  where those are one rank, without dp_replicate or pp, the experts stay outside FSDP, DTensors
  over ep whose gradients need no reduction (`experts_outside_fsdp`; bf16 with fp32 masters in
  AdamW where Choices.expert_masters).
- Tensor parallel (a "tp" dimension): the MoE layer has no tensor-parallel split. It runs on
  this rank's shard of the sequence (under sequence parallel the residual stream is split
  already; without, its input is sliced and its output gathered), with every weight replicated
  over tp. Each tp rank thus routes other tokens: the weights' gradients are partial sums,
  summed over tp by the gradient reduction (FSDP's, or `reduce_partial_grads_` before clipping).
- Load balancing: the router counts a micro-batch's routing over every rank that holds other
  tokens of it (the "dp_cp_tp" view).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

from kenotron.models.common.experts import GroupedExperts, copy_weights, sum_rows
from kenotron.models.common.moe import MoE, expert_alignment
from kenotron.models.common.router import RouterOutput
from kenotron.parallel.dims import Meshes
from kenotron.parallel.expert_dispatch import (
    CombineRows,
    SelectRows,
    destinations,
    padded_rows,
    pair_counts,
    received_grouping,
    send_order,
)
from kenotron.parallel.expert_even_split import EvenSplitDispatcher, pays_without_host_read
from kenotron.parallel.model_layout import ModelLayout, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.tensor import linear_on_local_weight, local_view

SEQ = Shard(1)


class UnevenSplitDispatcher:
    """The expert-parallel dispatcher above ep 2 and of float8 experts: each token travels once to
    each rank holding one of its experts and back (parallel/expert_dispatch.py); the splits are
    read on the host once per layer (parallel/expert_even_split.py says when this pays)."""

    def __init__(self, group: dist.ProcessGroup, ep: int) -> None:
        self.group, self.ep = group, ep
        self.assume_balanced = False
        """Take every split as even instead of exchanging the counts: the memory estimator's
        planning, on fake tensors whose values do not exist (the trainer never sets it)."""

    def _sizes(self, present: torch.Tensor, expert_ids: torch.Tensor, n_experts: int, align: int
               ) -> tuple[list[int], list[int], int, torch.Tensor]:
        """(rows sent per rank, rows received per rank, rows of the experts' grouped buffer), read
        on the host at once (the one synchronization of the layer), and the pairs received per
        local expert (on the device)."""
        tokens, k = expert_ids.shape
        local = n_experts // self.ep
        if self.assume_balanced:  # every token to every rank, its pairs spread evenly
            pairs = torch.full((local,), tokens * k // local, dtype=torch.int64, device=expert_ids.device)
            return [tokens] * self.ep, [tokens] * self.ep, tokens * k + local * (align - 1), pairs
        pairs = pair_counts(expert_ids, n_experts).view(self.ep, local)
        header = torch.cat([present.sum(0).unsqueeze(1), pairs], 1)
        received = torch.empty_like(header)
        dist.all_to_all_single(received, header, group=self.group)
        pairs = received[:, 1:].sum(0)
        sizes = torch.cat([header[:, 0], received[:, 0], padded_rows(pairs, align).view(1)]).tolist()
        return sizes[:self.ep], sizes[self.ep:2 * self.ep], sizes[-1], pairs

    def __call__(self, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts) -> torch.Tensor:
        ep, n_experts, (tokens, k) = self.ep, experts.n_experts, r.experts.shape
        local = n_experts // ep
        align = expert_alignment(experts, x)
        present = destinations(r.experts, ep, local)
        send_splits, recv_splits, real_rows, pairs_here = self._sizes(present, r.experts, n_experts, align)
        pair = send_order(present)[:sum(send_splits)]
        token, rank = pair % tokens, torch.div(pair, tokens, rounding_mode="floor")
        slot = token * ep + rank
        # Each sent row: the token, its experts on that rank (local ids; `local` for the others)
        # and their routing weights (0 for the others).
        ids = r.experts.index_select(0, token)
        here = torch.div(ids, local, rounding_mode="floor") == rank.unsqueeze(1)
        local_ids = torch.where(here, ids - rank.unsqueeze(1) * local, local)
        weights = SelectRows.apply(r.weights, token, slot, ep) * here
        recv_x = all_to_all_single_autograd(SelectRows.apply(x, token, slot, ep), recv_splits, send_splits, self.group)
        recv_w = all_to_all_single_autograd(weights, recv_splits, send_splits, self.group)
        recv_ids = local_ids.new_empty((sum(recv_splits), k))
        dist.all_to_all_single(recv_ids, local_ids, recv_splits, send_splits, group=self.group)
        g = received_grouping(recv_ids, pairs_here, k, align, real_rows)
        y = sum_rows(experts(recv_x, g.offsets, g.counts, copy_weights(recv_w, g), gather=g), g)
        back = all_to_all_single_autograd(y, send_splits, recv_splits, self.group)
        return CombineRows.apply(back, token, slot, tokens, ep)


def _replicated_over_tp(tensor: torch.Tensor, mesh: DeviceMesh, placements: list) -> nn.Parameter:
    return nn.Parameter(distribute_tensor(tensor.detach(), mesh, placements, src_data_rank=None))


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
            # The layer runs on sequence shards over cp and tp: those ranks share each sequence.
            moe.router.balance.sequence_ranks = meshes.dims.cp * meshes.dims.tp
        experts = moe.experts
        if ep_mesh is not None or tp_mesh is not None:
            dims = [m for m in ("ep", "tp") if meshes.get(m) is not None]
            mesh = meshes.root[tuple(dims)] if len(dims) > 1 else meshes.get(dims[0])
            placements = [Shard(0) if d == "ep" else Replicate() for d in dims]
            for pname in ("w13", "w2"):
                setattr(experts, pname, _replicated_over_tp(getattr(experts, pname), mesh, placements))
            # Each expert's gradient gathers the tokens of its ep group: the step's loss is scaled by
            # the data-parallel averaging size (dp_shard x cp x dp_replicate), while FSDP averages
            # the experts over 1/ep of those ranks; 1/ep makes the average the mean over all. Where
            # those are one rank the experts stay outside FSDP, nothing averages them, and 1/ep of
            # the loss' scale (ep) leaves the sum.
            grad_scale = 1.0 / ep_mesh.size() if ep_mesh is not None else 1.0
            experts.weight_view = local_view(tuple(Shard(0) if d == "ep" else Partial() for d in dims), grad_scale)
        if ep_mesh is not None:
            if experts.n_experts % ep_mesh.size():
                raise ValueError(f"ep={ep_mesh.size()} does not divide the {experts.n_experts} experts of {name}")
            ep = ep_mesh.size()
            even = pays_without_host_read(experts.n_experts, moe.args.top_k, ep, settings.float8_experts)
            moe.dispatcher = (EvenSplitDispatcher if even else UnevenSplitDispatcher)(ep_mesh.get_group(), ep)
        if tp_mesh is not None:
            _replicate_over_tp(moe, tp_mesh, settings.sequence_parallel)


def _replicate_over_tp(moe: MoE, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """The layer's other weights replicated over tp (partial gradients); it runs on this rank's
    sequence shard."""
    view = local_view((Partial(),))
    for module in moe.modules():
        if isinstance(module, nn.Linear):
            module.weight = _replicated_over_tp(module.weight, tp_mesh, [Replicate()])
            if module.bias is not None:
                module.bias = _replicated_over_tp(module.bias, tp_mesh, [Replicate()])
            linear_on_local_weight(module, view)
    parallelize_module(moe, tp_mesh, PrepareModuleInput(
        input_layouts=(SEQ if sequence_parallel else Replicate(),), desired_input_layouts=(SEQ,),
        use_local_output=True,
    ))
    if not sequence_parallel:
        parallelize_module(moe, tp_mesh, PrepareModuleOutput(
            output_layouts=SEQ, desired_output_layouts=Replicate(), use_local_output=True,
        ))
