"""The MoE layers on fake tensors: what they allocate, without the values routing depends on.

An MoE layer's shapes depend on where its tokens go: how many copies each expert receives
(the per-expert loop splits the rows by count; the grouped GEMM's output does not depend on
it) and, under expert parallelism, how many copies travel to each rank (the all-to-all's
splits are read on the host). Fake tensors have no values, so the estimator plans the even
routing that load balancing aims at:

- the experts compute through torch._grouped_mm over the whole grouped buffer (its fake kernel
  takes bf16), or for other dtypes through a stand-in with its allocations (output forward;
  gradients of the rows and of the stacked weights backward): those of the grouped path, and
  of the per-expert loop up to the padding rows;
- under eager CUDA runs the experts' gate allocates as the fused Triton kernel does (it keeps
  h and the routing weights, kernels/expert_swiglu.py);
- the even-split dispatcher (EvenSplitDispatcher, ep 2) reads nothing on the host and runs as
  built: every token to every rank, the grouped buffer planned for the worst case; the
  deduplicated one (UnevenSplitDispatcher, above ep 2 and float8 experts) takes every split as even
  (its assume_balanced): each rank sends and receives top_k x tokens copies, its all-to-all
  buffers included.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from kenotron.models.common.experts import GroupedExperts, Grouping, gather_grouped_mm, gather_rows, swiglu_rows
from kenotron.models.common.moe import MoE
from kenotron.parallel.expert import UnevenSplitDispatcher


class _GroupedMMMemory(torch.autograd.Function):
    """Allocations of torch._grouped_mm(x (rows, K), w (groups, K, N)): (rows, N) forward; grad x and
    grad w backward. With `rows`, those of gather_grouped_mm: x is the tokens the rows gather."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x.new_empty((x.shape[0] if rows is None else rows, w.shape[-1]))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), None


class _ExpertGateMemory(torch.autograd.Function):
    """Allocations of the fused experts' gate: (rows, F) forward, h and the weights kept; dh and dscale backward."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, scale)
        return h.new_empty((h.shape[0], h.shape[1] // 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, scale = ctx.saved_tensors
        return torch.empty_like(h), torch.empty_like(scale)


def _experts_memory(experts: GroupedExperts, x: torch.Tensor, offsets: torch.Tensor, counts: torch.Tensor,
                    scale: torch.Tensor, gather: Grouping | None = None) -> torch.Tensor:
    """GroupedExperts.forward with the stand-ins (bound as a method: pipeline stages copy it along)."""
    w13, w2 = experts.local_weights()
    fused_gather = gather is not None and experts.gathers_in_first_product()
    if gather is not None and not fused_gather:
        x = gather_rows(x, gather)
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    # As GroupedExperts.forward: the weights in the compute dtype, a copy (kept for backward) where
    # they are fp32 outside FSDP (expert parallel with efsdp one rank, parallel/data_parallel.py).
    w13, w2 = w13.to(x.dtype), w2.to(x.dtype)
    if experts.kernel == "grouped_mm" and x.dtype == torch.bfloat16:
        # torch._grouped_mm itself has a fake kernel (bf16): its allocations, and the op activation
        # checkpointing's selective policy saves.
        if fused_gather:
            h = gather_grouped_mm(x, w13, gather)
        else:
            h = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offsets)
        return torch._grouped_mm(experts.swiglu(h, scale), w2.transpose(-2, -1), offs=offsets)
    h = _GroupedMMMemory.apply(x, w13.transpose(-2, -1), gather.rows if fused_gather else None)
    return _GroupedMMMemory.apply(experts.swiglu(h, scale), w2.transpose(-2, -1))


def use_moe_memory(model: nn.Module, fused_gate: bool) -> None:
    """Every MoE layer of `model` computes its experts through the stand-ins (before the plan)."""
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            module.forward = types.MethodType(_experts_memory, module)  # type: ignore[method-assign]
            module.swiglu = _ExpertGateMemory.apply if fused_gate else swiglu_rows


def plan_even_routing(model: nn.Module) -> None:
    """Every deduplicating expert-parallel dispatcher of `model` takes its splits as even (after the plan)."""
    for module in model.modules():
        if isinstance(module, MoE) and isinstance(module.dispatcher, UnevenSplitDispatcher):
            module.dispatcher.assume_balanced = True
