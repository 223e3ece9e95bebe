"""Fused Triton kernels for RoPE and SwiGLU (and the MoE experts' gate, kernels/expert_swiglu.py)
in uncompiled blocks (`tuning.eager_kernels`).

An eager step spends more time in RoPE's and SwiGLU's elementwise kernels than in its
optimizer (docs/performance.md); kenotron/kernels/rope_swiglu.py does each
in one pass. The trainer resolves the choice once (`kenotron.kernel_choice.tuning.resolve_eager_kernels`,
before any process group) and installs the kernels on the meta model before the plan is applied
(`use_eager_kernels`), as it does for attention backends: pipeline stages are copies and keep them.
Compiled blocks keep the PyTorch ops, which Inductor fuses on its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.experts import GroupedExperts, swiglu_rows
from kenotron.models.common.mlp import SwiGLU, silu_mul
from kenotron.models.common.rope import apply_rope


def _plain_or(kernel: Callable, fallback: Callable) -> Callable:
    """The fused kernel on plain CUDA tensors; the PyTorch ops on DTensors (kernels see local data only)."""

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        if any(isinstance(t, DTensor) or not t.is_cuda for t in tensors):
            return fallback(*tensors)
        return kernel(*tensors)

    run.__name__ = getattr(kernel, "__name__", "fused")
    return run


def use_eager_kernels(model: nn.Module, kernels: str) -> None:
    """With kernels == "triton", give every attention its fused RoPE and every SwiGLU (and MoE
    experts' module) its fused gate."""
    if kernels != "triton":
        return
    # optional package: Triton kernels, only with tuning.eager_kernels=triton
    from kenotron.kernels.expert_swiglu import triton_expert_swiglu
    from kenotron.kernels.rope_swiglu import triton_rope, triton_silu_mul

    rope, gate = _plain_or(triton_rope, apply_rope), _plain_or(triton_silu_mul, silu_mul)
    expert_gate = _plain_or(triton_expert_swiglu, swiglu_rows)
    for module in model.modules():
        if isinstance(module, GQAttention):
            module.rope_fn = rope
        elif isinstance(module, SwiGLU):
            module.silu_mul = gate
        elif isinstance(module, GroupedExperts):
            module.swiglu = expert_gate


def use_expert_kernel(model: nn.Module, kernel: str, gate: str = "torch") -> None:
    """Give every MoE layer's experts the resolved expert kernel ("grouped_mm" or "for_loop") and
    gate ("triton" or "torch", Choices.expert_gate)."""
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            module.kernel, module.gate = kernel, gate
