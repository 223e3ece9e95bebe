"""Stand-ins, on fake CPU tensors, for CUDA kernels whose memory differs from the CPU path.

The estimator runs the step on fake tensors that live on the CPU (FSDP, DTensor and the
fake process group need no GPU that way), but a CPU-only torch decomposes some ops that
CUDA runs as one kernel, and the decomposition keeps different tensors for backward:

- `F.rms_norm`: CUDA runs `_fused_rms_norm`, which saves the input and one fp32 `rstd` per
  row. A CPU-only build decomposes it into an fp32 upcast, pow, mean, rsqrt and two
  multiplications, keeping several fp32 copies of the input: 3-5x the memory per norm.

- kenotron's gradient norm (`parallel/grad_norm.py`) takes, on the CPU, a per-tensor path
  for accuracy that makes one gradient-sized temporary; on CUDA it runs one multi-tensor
  norm kernel (`torch._foreach_norm`) that makes none.

- the fused Triton SwiGLU gate of eager CUDA runs (kernels/rope_swiglu.py) keeps its two
  inputs for backward where the PyTorch ops also keep silu(a); `use_fused_gate_memory`
  gives each SwiGLU a stand-in with the kernel's allocations. (The fused RoPE keeps what the
  PyTorch ops keep, so RoPE stays as it is.)

- MLA's attention with values narrower than the keys (`Choices.narrow_values`): CUDA runs
  cuDNN's kernel, which keeps q, k, v, its output (laid out as q is) and an fp32 log-sum-exp; on
  the CPU SDPA falls back to its math kernel, which keeps the whole score matrix.
  `use_narrow_value_memory` gives each MLA module a stand-in with cuDNN's allocations.

`cuda_kernel_memory()` swaps in, for the duration of an estimate, an autograd function with
the CUDA kernel's allocations (output, rstd; grad input, grad weight) and no values, and the
CUDA branch of the gradient norm. The RMSNorm stand-in refuses real tensors, so it can never
change a real computation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor

from kenotron.dtensor import local_tensor
from kenotron.models.common.latent_attention import LatentAttention
from kenotron.models.common.mlp import SwiGLU, silu_mul
from kenotron.parallel import grad_norm


def _is_fake(t: torch.Tensor) -> bool:
    local = local_tensor(t)
    return isinstance(local, FakeTensor)


class _FusedRMSNormMemory(torch.autograd.Function):
    """Allocations of CUDA's fused RMSNorm: out and fp32 rstd forward; grad input and weight backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty_like(x)
        rstd = torch.empty_like(x[..., :1], dtype=torch.float32)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, _rstd, weight = ctx.saved_tensors
        grad_weight = torch.empty_like(weight) if weight is not None and ctx.needs_input_grad[1] else None
        return torch.empty_like(x), grad_weight


def _rms_norm_memory(input, normalized_shape, weight=None, eps=None):
    if not _is_fake(input):
        raise RuntimeError("the estimator's rms_norm stand-in only runs on fake tensors; it computes no values")
    return _FusedRMSNormMemory.apply(input, weight)


class _FusedSiluMulMemory(torch.autograd.Function):
    """Allocations of the fused silu(a) * b kernel: out forward (a and b kept); da and db backward."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b)


def _silu_mul_memory(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if isinstance(a, DTensor) or isinstance(b, DTensor):
        return silu_mul(a, b)  # the trainer's fused gate falls back to the PyTorch ops on DTensors too
    if not (_is_fake(a) and _is_fake(b)):
        raise RuntimeError("the estimator's silu_mul stand-in only runs on fake tensors; it computes no values")
    return _FusedSiluMulMemory.apply(a, b)


def use_fused_gate_memory(model: torch.nn.Module) -> None:
    """Every SwiGLU of `model` allocates as the fused Triton gate does (eager CUDA runs)."""
    for module in model.modules():
        if isinstance(module, SwiGLU):
            module.silu_mul = _silu_mul_memory


class _CudnnAttentionMemory(torch.autograd.Function):
    """Allocations of cuDNN's causal SDPA on (batch, heads, seq, width): the output, as wide as v and
    laid out as q is (q here: heads-major views of (batch, seq, heads, width) tensors), and the fp32
    log-sum-exp forward (q, k, v kept); dq, dk and dv backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, heads, seq, _ = q.shape
        out = q.new_empty((batch, seq, heads, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty((batch, heads, seq, 1), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _cudnn_attention_memory(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if not _is_fake(q):
        raise RuntimeError("the estimator's cuDNN attention stand-in only runs on fake tensors; it computes no values")
    return _CudnnAttentionMemory.apply(q, k, v)


def use_narrow_value_memory(model: torch.nn.Module) -> None:
    """Every MLA module that gives its kernel the values unpadded allocates as cuDNN's does (the
    estimate runs FlexAttention's jobs through SDPA too: fake_job.estimated_run)."""
    for module in model.modules():
        if isinstance(module, LatentAttention) and module.narrow_value_attention is not None:
            module.narrow_value_attention = _cudnn_attention_memory


def _sum_of_squares_cuda_path(tensors: list[torch.Tensor], kernel: str) -> torch.Tensor:
    """grad_norm._sum_of_squares as it runs on CUDA, no big temporaries: the Triton kernel's fp32
    partial sum per 8192-element block (kenotron/kernels/sum_of_squares.py), or one multi-tensor norm."""
    if kernel == "triton":
        blocks = sum(-(-t.numel() // 8192) for t in tensors)
        return torch.empty(blocks, dtype=torch.float32, device=tensors[0].device).sum()
    return torch.stack(torch._foreach_norm(tensors, 2)).float().pow(2).sum()


@contextlib.contextmanager
def cuda_kernel_memory() -> Iterator[None]:
    """While active, RMSNorm and the gradient norm allocate what their CUDA kernels do."""
    original_norm, original_sum = F.rms_norm, grad_norm._sum_of_squares
    F.rms_norm = _rms_norm_memory
    grad_norm._sum_of_squares = _sum_of_squares_cuda_path
    try:
        yield
    finally:
        F.rms_norm, grad_norm._sum_of_squares = original_norm, original_sum
