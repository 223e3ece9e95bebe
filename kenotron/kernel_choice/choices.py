"""Every device-dependent choice of a run, settled once by resolve_run (train/resolve.py) before
any process group: the choices that need no built model come settled from config_checks.py
(which the launcher runs before importing torch); this module completes them with the meta model.

A choice depends on the config, the mesh degrees, the meta model and the `Target` the job runs
on: the device type, its GPU generation and whether Triton imports there. The trainer passes
the device it got; the memory estimator plans for the GPU machine the config names (CUDA with
Triton, unless training.device = "cpu"). A choice that cannot run there is a ConfigError
naming the config key and the fix.

Defaults follow docs/performance.md: master weights on one CUDA device (bf16 parameters, fp32
masters in AdamW), FSDP's mixed precision for eager single-device runs where they do not apply,
autocast otherwise; the Triton kernels on CUDA; the chunked fused loss (vocabulary-parallel under
tensor parallel) unless the pipeline's per-microbatch loss applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kenotron.config import ConfigError, JobConfig
from kenotron.degrees import ParallelDims
from kenotron.kernel_choice.attention_backend import (
    auto_picks_flash_attn,
    check_flash_attn_kernel,
    takes_narrow_values,
)
from kenotron.kernel_choice.config_checks import Kernels
from kenotron.kernel_choice.target import Target
from kenotron.kernel_choice.tuning import resolve_ssm_kernel
from kenotron.models.common.mamba import unsupported_scan_sizes


@dataclass(frozen=True)
class Choices:
    """What runs, decided once: read by the job builder, the step and the estimator."""

    device_type: str
    attention_backend: str
    """auto (SDPA, cuDNN first on CUDA), an SDPA kernel, flex or flash_attn."""
    eager_kernels: str
    """"triton" or "torch": RoPE and SwiGLU in uncompiled blocks."""
    ssm_kernel: str
    """"triton" or "torch": Mamba-2's scan."""
    fused_loss: bool
    """The chunked output-projection + cross-entropy replaces the output layer."""
    loss_kernel: str
    """The fused loss's chunk step: "triton", "compiled" or "torch"."""
    loss_chunk_tokens: int
    grad_norm_kernel: str
    """"triton" or "torch"."""
    adamw: str
    """AdamW's kernel: "triton", "fused", "foreach" or "for-loop"."""
    precision: str
    """"float32"; bf16 by "master_weights", "fsdp" (FSDP's mixed precision casts the weights) or "autocast"."""
    expandable_segments: bool
    empty_cache_after_first_step: bool
    expert_kernel: str = "for_loop"
    """MoE experts: "grouped_mm" (torch._grouped_mm) or "for_loop"."""
    expert_masters: bool = False
    """The routed experts outside FSDP keep bf16 weights with fp32 masters in AdamW (config_checks.py's expert_masters)."""
    expert_gate: str = "torch"
    """The routed experts' gate: "triton" (one kernel each way) or "torch" (tuning.py's resolve_expert_gate)."""
    narrow_values: bool = False
    """MLA's values go to the attention kernel at their own width, not zero-padded to the keys'
    (attention_backend.py's takes_narrow_values)."""

    @property
    def fused_expert_gate(self) -> bool:
        """The routed experts' gate runs as one Triton kernel: expert_gate's, or the eager kernels'
        (the per-expert loop's, models/common/eager_kernels.py)."""
        return self.expert_gate == "triton" or self.eager_kernels == "triton"

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32 if self.precision == "float32" else torch.bfloat16


def uses_fused_loss(choice: str, tensor_parallel: bool, pipeline: bool, meta_model: nn.Module,
                    loss_parallel: bool = True) -> bool:
    """auto -> fused (under tensor parallel the vocabulary-parallel one, train/vocab_parallel_loss.py,
    when `loss_parallel` keeps the vocabulary sharded), except under pipeline parallel (the last
    stage computes the plain loss per microbatch). "fused" with pipeline parallel was refused before
    (config_checks.py's check_fused_loss_layout); here, without an output layer."""
    has_output = isinstance(getattr(meta_model, "output", None), nn.Linear)
    if choice == "fused" and not has_output:
        raise ConfigError("tuning.loss='fused' does not combine with this model (no output layer); use 'auto' or 'plain'")
    vocabulary_sharded = not tensor_parallel or loss_parallel  # auto keeps a plain loss_parallel=false run plain
    return choice == "fused" or (choice == "auto" and has_output and not pipeline and vocabulary_sharded)


def resolve_choices(cfg: JobConfig, dims: ParallelDims, target: Target, meta_model: nn.Module,
                    kernels: Kernels, all_to_all_degree: int = 1) -> Choices:
    """Complete `kernels` (config_checks.py's settle_kernels for the same cfg, dims and target) with
    what the meta model and the imported packages decide; ConfigError when one cannot run.
    `all_to_all_degree`: the part of cp the heads split over (degrees.py's ulysses_degree)."""
    u, device_type = cfg.tuning, target.device_type
    attention = kernels.attention_backend
    if attention == "flash_attn" and target.packages_here:
        check_flash_attn_kernel(cfg, target)
    # A named all-to-all over all of cp runs the kernel whole; under cp_scheme "auto" the scheme,
    # and with it this choice, settles later (planner/cp_scheme_choice.py's settle_cp_scheme).
    all_to_all = all_to_all_degree if cfg.parallelism.cp_scheme == "ulysses" else 1
    if attention == "auto" and auto_picks_flash_attn(cfg, dims.cp, meta_model, target.cuda_major, all_to_all):
        attention = "flash_attn"
    ssm_kernel = kernels.ssm_kernel
    unsupported = unsupported_scan_sizes(meta_model) if ssm_kernel == "triton" else ""
    if unsupported:  # sizes the Triton scan does not take: auto falls back, "triton" is refused
        ssm_kernel = resolve_ssm_kernel(u.ssm_kernel, device_type, unsupported, target.triton)
    return Choices(
        device_type=device_type,
        attention_backend=attention,
        eager_kernels=kernels.eager_kernels,
        ssm_kernel=ssm_kernel,
        # DoReMi's proxy needs per-token losses (train/doremi.py), which the fused loss never forms.
        fused_loss=uses_fused_loss(u.loss, dims.tp > 1, dims.pp > 1, meta_model, u.loss_parallel)
        and not cfg.doremi.reference,
        loss_kernel=kernels.loss_kernel,
        loss_chunk_tokens=u.loss_chunk_tokens,
        grad_norm_kernel=kernels.grad_norm_kernel,
        adamw=kernels.adamw,
        precision=kernels.precision,
        expandable_segments=u.expandable_segments and device_type == "cuda",
        empty_cache_after_first_step=u.empty_cache_after_first_step and device_type == "cuda",
        expert_kernel=kernels.expert_kernel,
        expert_masters=kernels.expert_masters,
        expert_gate=kernels.expert_gate,
        narrow_values=takes_narrow_values(attention, target, meta_model, cfg.training.seq_len,
                                          torch.float32 if kernels.precision == "float32" else torch.bfloat16),
    )
