"""FlashAttention-4 (the `flash-attn-4` package) as torch custom ops, for compiled and eager blocks.

FA4's kernels are written in NVIDIA's CuTe DSL and compiled at their first call for the GPU
they run on (SM90 Hopper, SM100 Blackwell and later). Its Python entry point,
`flash_attn.cute.flash_attn_func`, is an autograd.Function that torch.compile cannot trace
into (the DSL's JIT runs inside it). Here its forward and backward are each one custom op,
`kenotron::fa4_forward` and `kenotron::fa4_backward`, with fake implementations that give the
output shapes: a compiled block sees them as opaque kernels, as it sees SDPA's, and autograd
connects them (`register_autograd`).

The package installs `flash_attn/cute/` only, so it coexists with flash-attn 2 (`flash_attn`).
It is imported lazily, at the first call, by module path (`MODULE`), so a process without it
never loads it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

MODULE = "flash_attn.cute.interface"
INSTALL_HINT_FA4 = "pip install flash-attn-4 (CUDA 13: pip install 'flash-attn-4[cu13]')"


def import_fa4() -> ModuleType | None:
    """FA4's interface module, or None when the package is not installed (or does not import)."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        return None
    if not (hasattr(module, "_flash_attn_fwd") and hasattr(module, "_flash_attn_bwd")):
        return None  # another layout of the package: its private kernels moved
    return module


def _fa4() -> ModuleType:
    module = import_fa4()
    if module is None:
        raise RuntimeError(f"FlashAttention-4 ({MODULE}) is not importable here; {INSTALL_HINT_FA4}")
    return module


@torch.library.custom_op("kenotron::fa4_forward", mutates_args=())
def fa4_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention on (batch, seq, heads, head_dim): the output and the fp32 log-sum-exp
    (batch, heads, seq) that the backward needs. k/v may have fewer heads (a divisor of q's)."""
    result = _fa4()._flash_attn_fwd(q.contiguous(), k.contiguous(), v.contiguous(), softmax_scale=softmax_scale,
                                    causal=True, return_lse=True)
    return result[0], result[1]  # later fields (versions differ) are for MLA and fp8 only


@fa4_forward.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq, heads, _ = q.shape
    out = q.new_empty((batch, seq, heads, v.shape[-1]))
    return out, q.new_empty((batch, heads, seq), dtype=torch.float32)


@torch.library.custom_op("kenotron::fa4_backward", mutates_args=())
def fa4_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k and v (k and v with their own, possibly fewer, heads)."""
    dq, dk, dv = _fa4()._flash_attn_bwd(q.contiguous(), k.contiguous(), v.contiguous(), out, dout.contiguous(), lse,
                                        softmax_scale, True)[:3]
    return dq, dk, dv


@fa4_backward.register_fake
def _(dout, q, k, v, out, lse, softmax_scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        k, memory_format=torch.contiguous_format), torch.empty_like(v, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, softmax_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale


def _backward(ctx, dout: torch.Tensor, dlse: torch.Tensor | None):
    # The log-sum-exp is an output for the backward's sake only: nothing downstream uses it, so
    # its gradient is None or zero and is not propagated.
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = fa4_backward(dout, q, k, v, out, lse, ctx.softmax_scale)
    return dq, dk, dv, None


fa4_forward.register_autograd(_backward, setup_context=_setup_context)


def fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """flash_attn_func's calling form, (batch, seq, heads, head_dim) in and out, causal only."""
    if not causal:
        raise ValueError("kenotron's FlashAttention-4 path runs causal attention only (causal=True)")
    out, _ = fa4_forward(q, k, v, q.shape[-1] ** -0.5)
    return out
