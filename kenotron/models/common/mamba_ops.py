"""Two pieces of the Mamba-2 mixer as autograd functions that keep only their inputs for
backward and recompute the rest, in plain PyTorch ops (CPU and GPU; torch.compile traces them
and fuses each direction).

Written out by the ops instead, eager autograd would keep the convolution's padded input and
its output beside the activation's, and the gated norm's four fp32 intermediates: for
Mamba-2 1.3B at 8 x 2048 tokens, 1.5 GiB per layer more than these (the estimator's figures,
docs/performance.md). Their inputs are slices of the in-projection's output or the scan's
output, which are kept anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, history: torch.Tensor | None) -> torch.Tensor:
    """sum_k weight[:, k] x_{t-K+1+k} (+ bias) over (batch, seq, channels); weight (channels, K)."""
    kernel, length = weight.shape[1], x.shape[1]
    before = x.new_zeros(x.shape[0], kernel - 1, x.shape[2]) if history is None else history.to(x.dtype)
    padded = torch.cat([before, x], dim=1)
    out = padded[:, :length] * weight[:, 0]
    for k in range(1, kernel):
        out = out + padded[:, k : k + length] * weight[:, k]
    return out + bias if bias is not None else out


class _ConvSiLU(torch.autograd.Function):
    """silu(causal depthwise convolution of x), keeping x, weight and bias."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return F.silu(_conv(x, weight, bias, None))

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        kernel, length = weight.shape[1], x.shape[1]
        # The convolution again as the forward computed it, SiLU's slope applied in one op.
        grad_pre = torch.ops.aten.silu_backward(grad, _conv(x, weight, bias, None))
        # out_t = sum_k w_k x_{t-K+1+k}: x_s receives w_k grad_{s+K-1-k}; w_k sums x_{t-K+1+k} grad_t.
        grad_x = grad_pre * weight[:, kernel - 1]
        grad_w = [None] * kernel
        grad_w[kernel - 1] = (x * grad_pre).sum((0, 1), dtype=torch.float32)
        for k in range(kernel - 1):
            shift = kernel - 1 - k
            grad_x[:, : length - shift].addcmul_(grad_pre[:, shift:], weight[:, k])
            grad_w[k] = (x[:, : length - shift] * grad_pre[:, shift:]).sum((0, 1), dtype=torch.float32)
        grad_b = grad_pre.sum((0, 1), dtype=torch.float32).to(bias.dtype) if bias is not None else None
        return grad_x, torch.stack(grad_w, dim=1).to(weight.dtype), grad_b


def conv_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              history: torch.Tensor | None = None) -> torch.Tensor:
    """silu of the causal depthwise convolution of x (batch, seq, channels) by weight (channels, K);
    `history` (batch, K - 1, channels): the inputs before x (generation; None: zeros)."""
    if history is not None or not torch.is_grad_enabled():
        return F.silu(_conv(x, weight, bias, history))
    return _ConvSiLU.apply(x, weight, bias)


class _GatedRMSNorm(torch.autograd.Function):
    """RMSNorm over groups of y * silu(z), times weight; keeps y, z, weight and one rstd per group."""

    @staticmethod
    def forward(ctx, y, z, weight, group_size: int, eps: float):
        wide = torch.promote_types(y.dtype, torch.float32)
        gated = (y.to(wide) * F.silu(z.to(wide))).unflatten(-1, (-1, group_size))
        rstd = torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(y, z, weight, rstd)
        ctx.group_size = group_size
        return (gated * rstd).flatten(-2).to(y.dtype) * weight.to(y.dtype)

    @staticmethod
    def backward(ctx, grad):
        y, z, weight, rstd = ctx.saved_tensors
        wide = torch.promote_types(y.dtype, torch.float32)
        grad_y, grad_z = torch.empty_like(y), torch.empty_like(z)
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device)
        # A slice of rows at a time: the fp32 intermediates of a whole batch would take several
        # times the activation itself.
        rows = max(1, _SLICE_ELEMENTS // y.shape[-1])
        flat = [t.reshape(-1, y.shape[-1]) for t in (y, z, grad, grad_y, grad_z)]
        rstd = rstd.reshape(-1, rstd.shape[-2], 1)
        for start in range(0, flat[0].shape[0], rows):
            yf, zf, g, gy, gz = (t[start : start + rows] for t in flat)
            yf, zf, g = yf.to(wide), zf.to(wide), g.to(wide)
            sig = torch.sigmoid(zf)
            silu = zf * sig
            normed = (yf * silu).unflatten(-1, (-1, ctx.group_size)) * rstd[start : start + rows]
            grad_w += (g * normed.flatten(-2)).sum(0)
            dn = (g * weight.to(wide)).unflatten(-1, (-1, ctx.group_size))
            dg = (rstd[start : start + rows] * (dn - normed * (dn * normed).mean(-1, keepdim=True))).flatten(-2)
            gy.copy_(dg * silu)
            gz.copy_(dg * yf * sig * (1 + zf * (1 - sig)))
        return grad_y, grad_z, grad_w.to(weight.dtype), None, None


_SLICE_ELEMENTS = 1 << 22
"""Elements per slice of the gated norm's backward (16 MiB per fp32 intermediate)."""


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """RMSNorm(y * silu(z)) * weight, normalized over each group of `group_size` channels in fp32."""
    if not torch.is_grad_enabled():
        return _GatedRMSNorm.forward(_NoContext(), y, z, weight, group_size, eps)
    return _GatedRMSNorm.apply(y, z, weight, group_size, eps)


class _NoContext:
    """Stands in for autograd's ctx when no gradient is needed."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass
