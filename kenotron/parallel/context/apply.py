"""The plan's context-parallel step: swap in CP attention, and slice each batch for this rank.

Models know nothing about parallelism: an attention module computes causal attention through
its `attention_fn` attribute (local SDPA by default). Under context parallel the plan replaces
it, in every module `plan.attention_modules` names, with a parameterless module that attends
over the whole sequence sharded across the cp ranks:

- on CUDA (`plan.cp_attention = "auto"` or `"torch"`): torch's own ring over the fused SDPA
  kernels (torch_ring.py);
- elsewhere, or with `"ring"`: kenotron's ring attention (ring.py), which also runs on CUDA.

The trainer (or a notebook) then feeds each rank its part of every micro-batch and the global
RoPE positions of those tokens: `SequenceSharder.shard(inputs, labels)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from kenotron.parallel.context.layout import ContextShard, SequenceLayout, shard_batch
from kenotron.parallel.context.ring import ROTATE_METHODS, RingAttention

if TYPE_CHECKING:
    from kenotron.parallel.plan import Plan

CP_ATTENTION_CHOICES = ("auto", "torch", "ring")


@dataclass(frozen=True)
class SequenceSharder:
    """Slices micro-batches for one context-parallel rank."""

    cp: int
    """Context-parallel degree."""
    rank: int
    """This rank's index along the cp mesh dimension."""
    load_balance: bool
    """Head-tail layout (see SequenceLayout); must match the attention's setting."""

    def layout(self, seq_len: int) -> SequenceLayout:
        return SequenceLayout(seq_len, self.cp, self.load_balance)

    def shard(self, inputs: torch.Tensor, labels: torch.Tensor) -> ContextShard:
        """This rank's tokens, labels and global positions of a (batch, seq_len) micro-batch."""
        return shard_batch(inputs, labels, self.layout(inputs.shape[1]), self.rank)


def resolve_cp_attention(choice: str, device_type: str) -> str:
    """"torch" or "ring" for a plan's cp_attention on this device type."""
    if choice not in CP_ATTENTION_CHOICES:
        raise ValueError(f"plan.cp_attention={choice!r} is not one of {', '.join(CP_ATTENTION_CHOICES)}")
    if choice == "auto":
        return "torch" if device_type == "cuda" else "ring"
    if choice == "torch" and device_type != "cuda":
        raise ValueError(
            f"plan.cp_attention='torch' needs CUDA (torch has no context-parallel kernel for {device_type}); "
            f"use 'auto' or 'ring'"
        )
    return choice


def context_parallel_attention(cp_mesh: DeviceMesh, plan: Plan) -> nn.Module:
    """A new CP attention module for one attention layer, as the plan chooses it."""
    if plan.cp_rotate_method not in ROTATE_METHODS:
        raise ValueError(f"plan.cp_rotate_method={plan.cp_rotate_method!r} is not one of {', '.join(ROTATE_METHODS)}")
    if resolve_cp_attention(plan.cp_attention, cp_mesh.device_type) == "torch":
        from kenotron.parallel.context.torch_ring import TorchRingAttention

        return TorchRingAttention(cp_mesh, plan.cp_load_balance, plan.cp_rotate_method)
    return RingAttention(cp_mesh.get_group(), plan.cp_load_balance, plan.cp_rotate_method)


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh, plan: Plan) -> SequenceSharder:
    """Replace `attention_fn` of every attention module; return how to slice the batches."""
    from kenotron.parallel.plan import PlanError, matching_modules

    modules = matching_modules(model, plan.attention_modules)
    if not modules:
        raise PlanError(f"plan.attention_modules={plan.attention_modules!r} matches no module of the model")
    for name, module in modules:
        if not hasattr(module, "attention_fn"):
            raise PlanError(
                f"{name} ({type(module).__name__}) has no attention_fn to replace under context parallel; "
                f"point plan.attention_modules at the attention modules"
            )
        module.attention_fn = context_parallel_attention(cp_mesh, plan)
    return SequenceSharder(cp_mesh.size(), cp_mesh.get_local_rank(), plan.cp_load_balance)
