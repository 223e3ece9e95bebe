"""Fused Triton kernels for RoPE and SwiGLU in uncompiled blocks (`model.eager_kernels`).

Measured on an H200 (docs/performance.md), an eager 1B step spends more time in RoPE's and
SwiGLU's elementwise kernels than in its optimizer; models/common/triton_kernels.py does each
in one pass. The trainer resolves the choice once (`resolve_eager_kernels`, before any process
group) and installs the kernels on the meta model before the plan is applied
(`use_eager_kernels`), as it does for attention backends: pipeline stages are copies and keep them.
Compiled blocks keep the PyTorch ops, which Inductor fuses on its own.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from kenotron.config import ConfigError
from kenotron.models.common.attention import GQAttention
from kenotron.models.common.mlp import SwiGLU, silu_mul
from kenotron.models.common.rope import apply_rope


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_triton_choice(field: str, choice: str, choices: tuple[str, ...], device_type: str, present: bool,
                          fallback: str) -> str:
    """The value that runs for a config `field` whose `choices` are "auto", "triton" and others:
    auto is "triton" on CUDA with the package `present`, else `fallback`; "triton" where it
    cannot run, or a value not in `choices`, is a ConfigError naming the fix."""
    if choice not in choices:
        raise ConfigError(f"{field}={choice!r} is not one of {', '.join(choices)}")
    if choice == "auto":
        return "triton" if device_type == "cuda" and present else fallback
    if choice == "triton" and (device_type != "cuda" or not present):
        missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
        others = [repr(c) for c in choices if c != "triton"]
        raise ConfigError(f"{field}='triton' needs {missing}; use {field}={', '.join(others[:-1])} or {others[-1]}")
    return choice


def resolve_eager_kernels(choice: str, device_type: str, compiled: bool, triton_present: bool | None = None) -> str:
    """"triton" or "torch" for `model.eager_kernels`; ConfigError when "triton" cannot run.

    `triton_present` None looks for the package here; the estimator passes True, planning for
    a GPU machine (whose torch brings triton) from one that may lack it."""
    present = triton_importable() if triton_present is None else triton_present
    if choice not in ("auto", "triton", "torch"):
        raise ConfigError(f"model.eager_kernels={choice!r} is not one of auto, triton, torch")
    if choice == "torch":
        return "torch"
    if compiled:
        if choice == "triton":
            raise ConfigError(
                "model.eager_kernels='triton' is for uncompiled blocks, but compile.enable=true (the compiler fuses "
                "RoPE and SwiGLU itself); set model.eager_kernels to 'auto' or compile.enable=false"
            )
        return "torch"
    if device_type != "cuda" or not present:
        if choice == "triton":
            missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
            raise ConfigError(f"model.eager_kernels='triton' needs {missing}; use model.eager_kernels='auto' or 'torch'")
        return "torch"
    return "triton"


def _plain_or(kernel: Callable, fallback: Callable) -> Callable:
    """The fused kernel on plain CUDA tensors; the PyTorch ops on DTensors (kernels see local data only)."""

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        if any(isinstance(t, DTensor) or not t.is_cuda for t in tensors):
            return fallback(*tensors)
        return kernel(*tensors)

    run.__name__ = getattr(kernel, "__name__", "fused")
    return run


def use_eager_kernels(model: nn.Module, kernels: str) -> None:
    """With kernels == "triton", give every attention its fused RoPE and every SwiGLU its fused gate."""
    if kernels != "triton":
        return
    from kenotron.models.common.triton_kernels import triton_rope, triton_silu_mul

    rope, gate = _plain_or(triton_rope, apply_rope), _plain_or(triton_silu_mul, silu_mul)
    for module in model.modules():
        if isinstance(module, GQAttention):
            module.rope_fn = rope
        elif isinstance(module, SwiGLU):
            module.silu_mul = gate
