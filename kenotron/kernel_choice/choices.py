"""Every device-dependent choice of a run, settled once by resolve_run (train/resolve.py) before
any process group.

A choice depends on the config, the mesh degrees, the meta model and the `Target` the job runs
on: the device type, its GPU generation and whether Triton imports there. The trainer passes
the device it got; the memory estimator plans for the GPU machine the config names (CUDA with
Triton, unless training.device = "cpu"). A choice that cannot run there is a ConfigError
naming the config key and the fix.

Defaults follow docs/performance.md: master weights on one CUDA device (bf16 parameters, fp32
masters in AdamW), FSDP's mixed precision for eager single-device runs where they do not apply,
autocast otherwise; the Triton kernels on CUDA; the chunked fused loss unless tensor parallel's
vocab-parallel loss or the pipeline's per-microbatch loss applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kenotron.config import ConfigError, JobConfig
from kenotron.degrees import ParallelDims
from kenotron.kernel_choice.attention_backend import auto_picks_flash_attn, check_attention, resolve_attention_backend
from kenotron.kernel_choice.target import Target
from kenotron.kernel_choice.tuning import (
    resolve_adamw_implementation,
    resolve_eager_kernels,
    resolve_expert_kernel,
    resolve_grad_norm_kernel,
    resolve_loss_kernel,
    resolve_ssm_kernel,
)
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

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32 if self.precision == "float32" else torch.bfloat16


def uses_fused_loss(choice: str, tensor_parallel: bool, pipeline: bool, meta_model: nn.Module) -> bool:
    """auto -> fused, except under tensor parallel (whose vocab-parallel loss shards the logits)
    and pipeline parallel (the last stage computes the plain loss per microbatch)."""
    has_output = isinstance(getattr(meta_model, "output", None), nn.Linear)
    if choice == "fused" and (tensor_parallel or pipeline or not has_output):
        why = "tensor parallel" if tensor_parallel else "pipeline parallel" if pipeline else "this model (no output layer)"
        raise ConfigError(f"tuning.loss='fused' does not combine with {why}; use 'auto' or 'plain'")
    return choice == "fused" or (choice == "auto" and has_output and not tensor_parallel and not pipeline)


def _precision(cfg: JobConfig, dims: ParallelDims, target: Target, accum: int) -> str:
    t, mp = cfg.training, cfg.tuning.mixed_precision
    if t.param_dtype != "bfloat16":
        return "float32"
    data_parallel = dims.dp_replicate * dims.dp_shard * dims.cp > 1
    if mp == "master_weights":
        if dims.world_size > 1 or accum > 1:
            raise ConfigError(
                f"tuning.mixed_precision='master_weights' runs on one device without gradient accumulation (its "
                f"gradients are bf16), but this job has {dims.world_size} ranks and {accum} micro-steps per step; use "
                f"mixed_precision='auto' (FSDP's mixed precision casts the weights with several ranks)"
                + (f" or global_batch_size={t.local_batch_size}" if dims.world_size == 1 else "")
            )
        return "master_weights"
    if data_parallel:
        return "fsdp"  # FSDP (or its replicate-only variant) casts the weights whatever was asked
    if dims.world_size > 1 or mp == "autocast":
        return "autocast"
    if mp == "fsdp":
        return "fsdp"
    if target.device_type == "cuda" and accum == 1 and cfg.optimizer.name == "adamw":
        return "master_weights"
    # Eager single-device CUDA runs: FSDP's 1-device mesh casts the weights once per step.
    return "fsdp" if target.device_type == "cuda" and not cfg.compile.enable else "autocast"


def resolve_choices(cfg: JobConfig, dims: ParallelDims, target: Target, meta_model: nn.Module, accum: int) -> Choices:
    """Settle every choice for `target` (see the module docstring); ConfigError when one cannot run."""
    u, device_type = cfg.tuning, target.device_type
    attention = resolve_attention_backend(cfg.model.attention_backend, cfg.data.document_masking)
    check_attention(cfg, dims, meta_model, target, attention)
    if attention == "auto" and auto_picks_flash_attn(cfg, dims.cp, meta_model, target.cuda_major):
        attention = "flash_attn"
    adamw = resolve_adamw_implementation(u.adamw_implementation, device_type, target.triton)
    precision = _precision(cfg, dims, target, accum)
    return Choices(
        device_type=device_type,
        attention_backend=attention,
        eager_kernels=resolve_eager_kernels(u.eager_kernels, device_type, cfg.compile.enable, target.triton),
        ssm_kernel=resolve_ssm_kernel(u.ssm_kernel, device_type, unsupported_scan_sizes(meta_model), target.triton),
        # DoReMi's proxy needs per-token losses (train/doremi.py), which the fused loss never forms.
        fused_loss=uses_fused_loss(u.loss, dims.tp > 1, dims.pp > 1, meta_model) and not cfg.doremi.reference,
        loss_kernel=resolve_loss_kernel(u.loss_kernel, device_type, cfg.compile.enable, target.triton),
        loss_chunk_tokens=u.loss_chunk_tokens,
        grad_norm_kernel=resolve_grad_norm_kernel(u.grad_norm_kernel, device_type, target.triton),
        adamw=adamw,
        precision=precision,
        expandable_segments=u.expandable_segments and device_type == "cuda",
        empty_cache_after_first_step=u.empty_cache_after_first_step and device_type == "cuda",
        expert_kernel=resolve_expert_kernel(u.expert_kernel, device_type, target.cuda_major, precision != "float32"),
    )
