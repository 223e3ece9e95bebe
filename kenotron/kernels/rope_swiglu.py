"""Fused Triton kernels for the eager (uncompiled) CUDA path: RoPE and SwiGLU's silu(a) * b.

In eager mode each of these is several PyTorch kernels: RoPE on q and k is a multiply, a roll
and an addcmul forward and four kernels backward; silu(a) * b is two kernels forward (and
saves silu(a) for backward) and three backward. Each kernel reads and writes whole
activations, so these elementwise passes cost a noticeable share of an eager step
(docs/performance.md). Here each is one kernel forward and one backward that read every
input once and write every output once, computing in fp32.

torch.compile fuses the same operations itself, so compiled blocks keep the plain PyTorch
code (kenotron/kernel_choice/tuning.py chooses). Importing this module needs the `triton` package.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    x_ptr, out_ptr, cos_ptr, sin_ptr, seqlen, n_heads,
    sxb, sxs, sxh, sob, sos, soh, stab,
    SIGN: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # One program per (batch, position): all heads of that token, both halves of head_dim.
    pid = tl.program_id(0)
    b = pid // seqlen
    s = pid % seqlen
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HALF
    c = tl.load(cos_ptr + s * stab + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + s * stab + offs_d, mask=d_ok, other=0.0).to(tl.float32) * SIGN
    mask = (offs_h[:, None] < n_heads) & d_ok[None, :]
    xb = x_ptr + b.to(tl.int64) * sxb + s.to(tl.int64) * sxs + offs_h[:, None] * sxh + offs_d[None, :]
    x1 = tl.load(xb, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xb + HALF, mask=mask, other=0.0).to(tl.float32)
    ob = out_ptr + b.to(tl.int64) * sob + s.to(tl.int64) * sos + offs_h[:, None] * soh + offs_d[None, :]
    tl.store(ob, (x1 * c[None, :] - x2 * sn[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(ob + HALF, (x2 * c[None, :] + x1 * sn[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    """Rotate x (batch, seq, heads, head_dim) by the angles of cos/sin (seq, head_dim); any
    strides with a unit last one. sign=-1 rotates backwards (the gradient of sign=+1)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    bsz, seqlen, n_heads, head_dim = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((bsz, seqlen, n_heads, head_dim), dtype=x.dtype, device=x.device)
    half = head_dim // 2
    _rope_kernel[(bsz * seqlen,)](
        x, out, cos, sin, seqlen, n_heads,
        x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2), cos.stride(0),
        SIGN=sign, HALF=half, BLOCK_D=triton.next_power_of_2(half), BLOCK_H=triton.next_power_of_2(n_heads),
    )
    return out


class _TritonRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, 1)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rope(grad, cos, sin, -1), None, None


def triton_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same values as rope.apply_rope (computed in fp32, rounded once): x (batch, seq, heads,
    head_dim) rotated by cos/sin (seq, head_dim); returns a contiguous tensor of x's dtype."""
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {x.shape[-1]}")
    return _TritonRope.apply(x, cos, sin)


@triton.jit
def _silu_mul_fwd_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (a * tl.sigmoid(a) * b).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_bwd_kernel(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    # d silu(a) / da = sigmoid(a) * (1 + a * (1 - sigmoid(a)))
    tl.store(da_ptr + offs, (g * b * sig * (1.0 + a * (1.0 - sig))).to(da_ptr.dtype.element_ty), mask=m)
    tl.store(db_ptr + offs, (g * a * sig).to(db_ptr.dtype.element_ty), mask=m)


_BLOCK = 2048


class _TritonSiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        _silu_mul_fwd_kernel[(triton.cdiv(n, _BLOCK),)](a, b, out, n, BLOCK=_BLOCK)
        ctx.save_for_backward(a, b)  # not silu(a): one activation less than the unfused ops keep
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = grad.contiguous()
        da, db = torch.empty_like(a), torch.empty_like(b)
        n = a.numel()
        _silu_mul_bwd_kernel[(triton.cdiv(n, _BLOCK),)](grad, a, b, da, db, n, BLOCK=_BLOCK)
        return da, db


def triton_silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b in one kernel (fp32 math); a and b of the same shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"silu(a) * b needs equal shapes and dtypes, got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    return _TritonSiluMul.apply(a, b)
