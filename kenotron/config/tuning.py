"""The [tuning] section: choices whose measured best is already the default (kernels, precision
handling, allocator settings). They are not part of the public config; benchmarks and tests set
them to compare (docs/performance.md holds the measurements)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kenotron.config.ranges import at_least, ranged


@dataclass
class Tuning:
    """Internal kernel and overlap choices whose measured best is the default (docs/performance.md).

    Not part of the public interface: tests, benchmarks and experiments use them to run the
    other code paths; a run should leave them alone.
    """

    mixed_precision: Literal["auto", "fsdp", "autocast", "master_weights"] = "auto"
    """How bf16 runs on one device: fsdp (FSDP2 on a 1-device mesh casts the weights), autocast, or master_weights (bf16 parameters, fp32 masters in AdamW; one device, no accumulation); auto picks by device."""

    eager_kernels: Literal["auto", "triton", "torch"] = "auto"
    """RoPE and SwiGLU in uncompiled blocks: triton (fused kernels; CUDA) or torch (PyTorch ops); auto: triton on CUDA when it imports."""

    ssm_kernel: Literal["auto", "triton", "torch"] = "auto"
    """Mamba-2's mixer in training: triton (kenotron's op: convolution, SSD scan and gated norm in Triton kernels; CUDA) or torch (PyTorch ops, the chunked scan); auto: triton on CUDA when the model's sizes allow."""

    loss: Literal["auto", "plain", "fused"] = "auto"
    """plain: logits then cross-entropy; fused: both in token chunks, no full logits (vocabulary-parallel under tp); auto: fused but under pipeline parallel or tp with loss_parallel off (multi-token prediction heads: fused unless tp)."""

    loss_chunk_tokens: int = ranged(16384, at_least(1))
    """Tokens per chunk of the fused loss."""

    loss_kernel: Literal["auto", "triton", "compiled", "torch"] = "auto"
    """The fused loss's chunk step: triton (CUDA), compiled, or torch; auto: triton on CUDA, else compiled with compile.enable, else torch."""

    expert_kernel: Literal["auto", "grouped_mm", "for_loop"] = "auto"
    """MoE expert compute: grouped_mm (torch._grouped_mm over experts grouped in one buffer) or for_loop (one matmul per expert); auto: grouped_mm on CUDA GPUs of compute capability 9+ computing in bf16, else for_loop."""

    grad_norm_kernel: Literal["auto", "triton", "torch"] = "auto"
    """The gradient norm's sum of squares: triton (CUDA) or torch; auto: triton on CUDA."""

    adamw_implementation: Literal["auto", "triton", "fused", "foreach", "for-loop"] = "auto"
    """AdamW kernel: triton (CUDA), or torch's fused, foreach or for-loop; auto: triton on CUDA, else foreach."""

    muon_redistribution: Literal["owner", "every_rank"] = "owner"
    """Muon on sharded matrices: owner (all-to-all so each rank orthogonalizes whole matrices of its own, then back) or every_rank (all-gather each matrix everywhere); train/muon_layout.py."""

    muon_compile: Literal["auto", "on", "off"] = "auto"
    """Muon's Newton–Schulz through torch.compile; auto: on CUDA."""

    expandable_segments: bool = True
    """CUDA caching allocator grows segments in place (less fragmentation)."""

    empty_cache_after_first_step: bool = True
    """Release the CUDA allocator's cache once, after the first step (compilation and autotuning leave it laid out for themselves)."""

    fsdp_early_all_gather: bool = True
    """Under FSDP, start the next step's first all-gathers while the optimizer updates the rest."""

    fsdp_gradients_in_compute_pool: bool = True
    """Under FSDP on CUDA, allocate the sharded gradients from the compute stream's memory pool."""

    float8_all_gather: bool = False
    """With float8 tensorwise under FSDP, all-gather weights in float8."""

    ac_save_matmul_every: int = ranged(1, at_least(1))
    """For selective-op checkpointing: keep one matmul output in every this many (the rest are recomputed)."""

    loss_parallel: bool = True
    """With tp > 1, compute the cross-entropy on vocabulary shards instead of gathering full logits (the plain loss; loss auto takes the fused one only with this on)."""

    cp_load_balance: bool = True
    """Context parallel: rank r holds chunks r and 2·cp−1−r of 2·cp (even causal work); false: contiguous chunks."""

    cp_rotate_method: Literal["allgather", "alltoall"] = "allgather"
    """Context parallel: keys/values reach every rank by one all-gather or by a ring of sends."""

    cp_attention: Literal["auto", "torch", "ring", "flex"] = "auto"
    """Context-parallel attention: torch (its ring over fused SDPA; CUDA), flex (FlexAttention over gathered keys/values, for document masking), ring (kenotron's exact ring), auto (flex or torch on CUDA, ring elsewhere)."""

    pp_first_stage_weight: float = ranged(1.0, at_least(0))
    """Cost of the embedding in the automatic pipeline split, in blocks."""

    pp_last_stage_weight: float = ranged(1.0, at_least(0))
    """Cost of the final norm, output projection and loss in the automatic pipeline split, in blocks."""
