"""The plan's context-parallel step: swap in CP attention, and slice each batch for this rank.

Models know nothing about parallelism: an attention module computes causal attention through
its `attention_fn` attribute (local SDPA by default). Under context parallel the plan replaces
it, in every module the plan's `layout.attention_modules` names, with a parameterless module that attends
over the whole sequence sharded across the cp ranks:

- on CUDA (`plan.settings.cp_attention = "auto"` or `"torch"`): torch's own ring over the fused SDPA
  kernels (torch_ring.py);
- on CUDA with `data.document_masking` (`"auto"` or `"flex"`): FlexAttention against the
  gathered keys/values under each rank's block mask (flex_gather.py);
- elsewhere, or with `"ring"`: kenotron's ring attention (ring.py), which also runs on CUDA;
- with `plan.settings.cp_scheme = "ulysses"`, on any device: the all-to-all of heads around the
  ordinary attention kernel (ulysses.py), whatever `cp_attention` says.

With document masking the trainer hands the model the document ids of the whole sequence
(documents.py's SequenceDocuments) in place of a block mask; the model's attention passes them
to these modules, which mask every chunk pair by them.

The trainer (or a notebook) then feeds each rank its part of every micro-batch and the global
RoPE positions of those tokens: `SequenceSharder.shard(inputs, labels)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from kenotron.parallel.context.flex_gather import FlexContextAttention
from kenotron.parallel.context.layout import ContextShard, SequenceLayout, shard_batch
from kenotron.parallel.context.ring import RingAttention
from kenotron.parallel.context.torch_ring import TorchRingAttention
from kenotron.parallel.context.ulysses import UlyssesAttention
from kenotron.parallel.model_layout import ModelLayout, PlanError, matching_modules
from kenotron.parallel.parallel_settings import ParallelSettings


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


def cp_attention_kind(choice: str, device_type: str, document_masking: bool = False) -> str:
    """"torch", "flex" or "ring" for a settings' cp_attention: auto picks, on CUDA, FlexAttention
    with document masking (torch's ring has no document mask) and torch's ring without; kenotron's
    ring elsewhere; a named one is kept (resolve_run refuses torch and flex for a CPU job; the
    memory estimator builds a CUDA job's torch ring on its fake CPU mesh)."""
    if choice == "auto":
        if device_type != "cuda":
            return "ring"
        return "flex" if document_masking else "torch"
    return choice


def context_parallel_attention(cp_mesh: DeviceMesh, settings: ParallelSettings) -> nn.Module:
    """A new CP attention module for one attention layer, as the plan's settings choose it."""
    st = settings
    if st.cp_scheme == "ulysses":
        return UlyssesAttention(cp_mesh.get_group(), st.cp_load_balance)
    kind = cp_attention_kind(st.cp_attention, cp_mesh.device_type)
    if kind == "torch":
        return TorchRingAttention(cp_mesh, st.cp_load_balance, st.cp_rotate_method)
    if kind == "flex":
        return FlexContextAttention(cp_mesh.get_group(), st.cp_load_balance)
    return RingAttention(cp_mesh.get_group(), st.cp_load_balance, st.cp_rotate_method)


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh, layout: ModelLayout,
                           settings: ParallelSettings) -> SequenceSharder:
    """A plan's CP step: replace `attention_fn` of every attention module; return how to slice the batches."""
    if layout.attention_modules is None:
        raise PlanError("plan.layout.attention_modules is None: this model has no attention for context parallel to "
                        "split; use parallelism.cp=1")
    modules = matching_modules(model, layout.attention_modules)
    if not modules:
        raise PlanError(f"plan.layout.attention_modules={layout.attention_modules!r} matches no module of the model")
    for name, module in modules:
        if not hasattr(module, "attention_fn"):
            raise PlanError(
                f"{name} ({type(module).__name__}) has no attention_fn to replace under context parallel; "
                f"point plan.layout.attention_modules at the attention modules"
            )
        module.attention_fn = context_parallel_attention(cp_mesh, settings)
    return SequenceSharder(cp_mesh.size(), cp_mesh.get_local_rank(), settings.cp_load_balance)
