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
  ordinary attention kernel (ulysses.py), whatever `cp_attention` says; where the heads split
  over only part of cp (`plan.settings.cp_ulysses_degree` < cp), the all-to-all over that part
  around the ring of the lines above over the rest (Meshes.split_cp gives both sub-meshes).

With document masking the trainer hands the model the document ids of the whole sequence
(documents.py's SequenceDocuments) in place of a block mask; the model's attention passes them
to these modules, which mask every chunk pair by them.

The trainer (or a notebook) then feeds each rank its part of every micro-batch and the global
RoPE positions of those tokens: `SequenceSharder.shard(inputs, labels)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from kenotron.models.common.attention import causal_attention, sees_whole_sequence
from kenotron.parallel.context.flex_gather import FlexContextAttention
from kenotron.parallel.context.layout import ContextShard, SequenceLayout, shard_batch
from kenotron.parallel.context.ring import RingAttention
from kenotron.parallel.context.torch_ring import TorchRingAttention
from kenotron.parallel.context.ulysses import UlyssesAttention
from kenotron.parallel.dims import Meshes
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


def ring_attention_module(cp_mesh: DeviceMesh, settings: ParallelSettings) -> nn.Module:
    """A new ring attention module over `cp_mesh` (the whole cp, or the ring under an all-to-all),
    of the kind the settings' cp_attention names."""
    st = settings
    kind = cp_attention_kind(st.cp_attention, cp_mesh.device_type)
    if kind == "torch":
        return TorchRingAttention(cp_mesh, st.cp_load_balance, st.cp_rotate_method)
    if kind == "flex":
        return FlexContextAttention(cp_mesh.get_group(), st.cp_load_balance)
    return RingAttention(cp_mesh.get_group(), st.cp_load_balance, st.cp_rotate_method)


def context_parallel_attention(cp_mesh: DeviceMesh, settings: ParallelSettings,
                               split: tuple[DeviceMesh, DeviceMesh] | None = None,
                               kernel: Callable[..., torch.Tensor] = causal_attention) -> nn.Module:
    """A new CP attention module for one attention layer, as the plan's settings choose it.
    `split`: Meshes.split_cp's (ring, all-to-all) sub-meshes when the all-to-all spans part of cp.
    `kernel`: the layer's own whole-sequence kernel (SDPA's causal, or FlashAttention), which only
    the all-to-all over the whole of cp keeps; a ring runs its own."""
    st = settings
    if kernel is not causal_attention and (st.cp_scheme != "ulysses" or split is not None):
        raise PlanError(f"the attention kernel {kernel!r} runs under context parallel only as the all-to-all's "
                        "kernel over the whole of cp (parallelism.cp_scheme='ulysses' with heads that split over "
                        "every cp rank); use model.attention_backend='auto'")
    if st.cp_scheme != "ulysses":
        return ring_attention_module(cp_mesh, st)
    if split is None:
        return UlyssesAttention(cp_mesh.get_group(), st.cp_load_balance, kernel=kernel)
    ring_mesh, all_to_all_mesh = split
    return UlyssesAttention(all_to_all_mesh.get_group(), st.cp_load_balance, ring_attention_module(ring_mesh, st))


def _cp_split(meshes: Meshes, settings: ParallelSettings) -> tuple[DeviceMesh, DeviceMesh] | None:
    """The (ring, all-to-all) sub-meshes when Ulysses spans part of cp; None when it spans all
    of it (today's all-to-all alone) or the scheme is the ring."""
    cp = meshes.size("cp")
    degree = settings.cp_ulysses_degree or cp
    if settings.cp_scheme != "ulysses" or degree == cp:
        return None
    if degree == 1:
        raise PlanError("plan.settings.cp_ulysses_degree=1 leaves the all-to-all nothing to scatter; use "
                        "parallelism.cp_scheme='ring' (resolve_run refuses heads that split over no divisor of cp)")
    ring_mesh, all_to_all_mesh = meshes.split_cp(degree)
    cp_rank = meshes.coordinate("cp")
    # The token layout (SequenceLayout over the whole cp) assumes cp rank = ring rank x degree + all-to-all rank.
    if (ring_mesh.get_local_rank(), all_to_all_mesh.get_local_rank()) != divmod(cp_rank, degree):
        raise RuntimeError(f"cp rank {cp_rank} is ring rank {ring_mesh.get_local_rank()} and all-to-all rank "
                           f"{all_to_all_mesh.get_local_rank()} of the split cp mesh, not {divmod(cp_rank, degree)}")
    return ring_mesh, all_to_all_mesh


def apply_context_parallel(model: nn.Module, meshes: Meshes, layout: ModelLayout,
                           settings: ParallelSettings) -> SequenceSharder:
    """A plan's CP step on the job's meshes (cp > 1): replace `attention_fn` of every attention
    module; return how to slice the batches."""
    if layout.attention_modules is None:
        raise PlanError("plan.layout.attention_modules is None: this model has no attention for context parallel to "
                        "split; use parallelism.cp=1")
    modules = matching_modules(model, layout.attention_modules)
    if not modules:
        raise PlanError(f"plan.layout.attention_modules={layout.attention_modules!r} matches no module of the model")
    cp_mesh = meshes.get("cp")
    if cp_mesh is None:
        raise PlanError("context parallel needs a cp mesh dimension; use parallelism.cp > 1")
    split = _cp_split(meshes, settings)
    for name, module in modules:
        if not hasattr(module, "attention_fn"):
            raise PlanError(
                f"{name} ({type(module).__name__}) has no attention_fn to replace under context parallel; "
                f"point plan.layout.attention_modules at the attention modules"
            )
        own = module.attention_fn
        kernel = own if sees_whole_sequence(own) else causal_attention  # FlashAttention, else SDPA's causal
        module.attention_fn = context_parallel_attention(cp_mesh, settings, split, kernel)
    return SequenceSharder(cp_mesh.size(), cp_mesh.get_local_rank(), settings.cp_load_balance)
