"""The Mamba-2 mixer between its two projections as one PyTorch custom op with its backward:
`mamba_mixer(proj, conv_weight, conv_bias, A, D, dt_bias, norm_weight, head_dim, state, chunk_size, eps)`
-> the gated norm's output, the out-projection's input. CUDA only (Triton kernels); the
mixer's PyTorch path (models/common/mamba.py) computes the same on every device.

    proj (b, l, G·R) --conv+SiLU--> act [x | B | C] --SSD scan (+ dt from proj)--> y
         --gated RMSNorm with z from proj--> out (b, l, heads·head_dim)

Why one op: the in-projection's output is read where it lies (no z / xBC / dt slices copied out),
its gradient is written in place by the three backward pieces (no concatenation), and only
`proj`, the scan's output and one 1/rms per row and group are kept for backward; the
convolution is recomputed there (Mamba-2 1.3B: 142 MiB per layer less than keeping its output,
at 8 × 2048 tokens). torch.compile keeps the op whole, as it does the scan (ssd_op.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kenotron.kernels.ssd_op import scan_backward, scan_forward, scan_scratch
from kenotron.kernels.workspace import register_scratch

__all__ = ["mamba_mixer"]

_CONV_BLOCK_T, _CONV_BLOCK_C = 32, 128
_NORM_ROWS_PER_PROGRAM = 32


@dataclass(frozen=True)
class _Sizes:
    b: int
    l: int
    heads: int
    head_dim: int
    groups: int
    state: int

    @property
    def head_rows(self) -> int:
        """x (and z) columns per group."""
        return self.heads // self.groups * self.head_dim

    @property
    def group_rows(self) -> int:
        return 2 * self.head_rows + 2 * self.state + self.heads // self.groups

    @property
    def channels(self) -> int:
        return self.groups * (self.head_rows + 2 * self.state)

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


def _sizes(proj: Tensor, D: Tensor, head_dim: int, state: int) -> _Sizes:
    b, l, cols = proj.shape
    heads = D.shape[0]
    # cols = G·R = 2·heads·head_dim + 2·G·state + heads
    groups = (cols - 2 * heads * head_dim - heads) // (2 * state)
    return _Sizes(b, l, heads, head_dim, groups, state)


def _scan_views(act: Tensor, proj: Tensor, s: _Sizes) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x (b, l, heads, P), B and C (b, l, G, N) from act; dt (b, l, heads) from proj (a view with
    one group, a copy of heads' columns with several)."""
    hp, gn = s.inner, s.groups * s.state
    x = act[..., :hp].unflatten(-1, (s.heads, s.head_dim))
    B = act[..., hp : hp + gn].unflatten(-1, (s.groups, s.state))
    C = act[..., hp + gn :].unflatten(-1, (s.groups, s.state))
    dt = proj.view(s.b, s.l, s.groups, s.group_rows)[..., 2 * s.head_rows + 2 * s.state :].reshape(s.b, s.l, s.heads)
    return x, dt, B, C


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _constants(s: _Sizes) -> dict[str, int]:
    return {"GROUP_ROWS": s.group_rows, "HEAD_ROWS": s.head_rows, "NGROUPS": s.groups}


def _conv_forward(proj: Tensor, weight: Tensor, bias: Tensor | None, s: _Sizes) -> Tensor:
    # optional package: the Triton kernels load on the first CUDA call
    from kenotron.kernels.mamba_mixer import _conv_forward_kernel

    act = torch.empty(s.b, s.l, s.channels, dtype=proj.dtype, device=proj.device)
    grid = (s.b * _cdiv(s.l, _CONV_BLOCK_T), _cdiv(s.channels, _CONV_BLOCK_C))
    _conv_forward_kernel[grid](
        proj, weight, bias if bias is not None else weight, act, s.l, s.channels, *proj.stride()[:2], *act.stride()[:2],
        **_constants(s), NSTATE=s.state, KERNEL=weight.shape[1], HAS_BIAS=bias is not None,
        BLOCK_T=_CONV_BLOCK_T, BLOCK_C=_CONV_BLOCK_C)
    return act


def _norm_block(s: _Sizes) -> int:
    return 1 << (s.head_rows - 1).bit_length()


@torch.library.custom_op("kenotron::mamba_mixer", mutates_args=())
def mamba_mixer(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, A: Tensor, D: Tensor, dt_bias: Tensor,
                norm_weight: Tensor, head_dim: int, state: int, chunk_size: int, eps: float
                ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, y, rstd): the gated norm's output (b, l, heads·head_dim), and the scan's output and
    the norm's 1/rms (b·l, G), which backward reads. conv_weight (channels, K); A = -exp(A_log)."""
    # optional package: Triton kernel, loaded on use
    from kenotron.kernels.mamba_mixer import _gated_norm_forward_kernel

    proj = proj.contiguous()
    s = _sizes(proj, D, head_dim, state)
    act = _conv_forward(proj, conv_weight, conv_bias, s)
    x, dt, B, C = _scan_views(act, proj, s)
    y = torch.empty(s.b, s.l, s.heads, s.head_dim, dtype=proj.dtype, device=proj.device)
    scan_forward(x, dt, A, B, C, D, dt_bias, chunk_size, y)
    out = torch.empty(s.b, s.l, s.inner, dtype=proj.dtype, device=proj.device)
    rstd = torch.empty(s.b * s.l, s.groups, dtype=torch.float32, device=proj.device)
    _gated_norm_forward_kernel[(s.b * s.l, s.groups)](
        y, proj, norm_weight, out, rstd, s.inner, proj.stride(1), s.inner, eps, **_constants(s), BLOCK=_norm_block(s))
    return out, y, rstd


@mamba_mixer.register_fake
def _mamba_mixer_fake(proj, conv_weight, conv_bias, A, D, dt_bias, norm_weight, head_dim, state, chunk_size, eps):
    s = _sizes(proj, D, head_dim, state)
    return (proj.new_empty(s.b, s.l, s.inner), proj.new_empty(s.b, s.l, s.heads, s.head_dim),
            proj.new_empty(s.b * s.l, s.groups, dtype=torch.float32))


def _scratch(proj: Tensor, D: Tensor, head_dim: int, state: int, chunk_size: int, backward: bool) -> list[int]:
    """Bytes of each buffer one direction allocates and frees (kernels/workspace.py): the
    convolution's output (and in backward its gradient, the scan output's and dt's gradients,
    the norm weight's partial sums) and the scan's buffers."""
    s = _sizes(proj, D, head_dim, state)
    act = torch.empty(s.b, s.l, s.channels, dtype=proj.dtype, device="meta")
    x, _, B, _ = _scan_views(act, proj, s)
    c = proj.element_size()
    held = [act.nbytes]
    if backward:
        held += [act.nbytes, s.b * s.l * s.inner * c, s.b * s.l * s.heads * c,
                 _cdiv(s.b * s.l, _NORM_ROWS_PER_PROGRAM) * s.inner * 4]
    return held + scan_scratch(x, B, chunk_size, backward)


@torch.library.custom_op("kenotron::mamba_mixer_backward", mutates_args=())
def mamba_mixer_backward(dout: Tensor, proj: Tensor, y: Tensor, rstd: Tensor, conv_weight: Tensor,
                         conv_bias: Tensor | None, A: Tensor, D: Tensor, dt_bias: Tensor, norm_weight: Tensor,
                         head_dim: int, state: int, chunk_size: int
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dproj, dconv_weight, dconv_bias, dA, dD, d dt_bias, dnorm_weight) of `mamba_mixer`'s out
    (dconv_bias is computed, and ignored by autograd, when the convolution has no bias)."""
    # optional package: Triton kernels, loaded on use
    from kenotron.kernels.mamba_mixer import _conv_input_grad_kernel, _conv_slope_kernel, _gated_norm_backward_kernel

    dout = dout.contiguous()
    s = _sizes(proj, D, head_dim, state)
    dproj = torch.empty_like(proj)
    # The gated norm: the scan output's gradient, and z's into dproj.
    dy = torch.empty_like(y)
    programs = _cdiv(s.b * s.l, _NORM_ROWS_PER_PROGRAM)
    dnorm_part = torch.empty(programs, s.inner, dtype=torch.float32, device=proj.device)
    _gated_norm_backward_kernel[(programs, s.groups)](
        dout, y, proj, norm_weight, rstd, dy, dproj, dnorm_part, s.b * s.l, s.inner, s.inner, proj.stride(1), s.inner,
        **_constants(s), ROWS_PER_PROGRAM=_NORM_ROWS_PER_PROGRAM, BLOCK=_norm_block(s))
    # The scan: x's gradient straight into dact, B's and C's copied there, dt's into dproj.
    act = _conv_forward(proj, conv_weight, conv_bias, s)
    x, dt, B, C = _scan_views(act, proj, s)
    dact = torch.empty_like(act)
    dx, _, dB, dC = _scan_views(dact, proj, s)
    ddt = torch.empty(s.b, s.l, s.heads, dtype=proj.dtype, device=proj.device)
    dA, dB_sum, dC_sum, dD, dbias = scan_backward(dy, x, dt, A, B, C, D, dt_bias, chunk_size, dx, ddt)
    dB.copy_(dB_sum)
    dC.copy_(dC_sum)
    heads_per_group = s.heads // s.groups
    dproj.view(s.b, s.l, s.groups, s.group_rows)[..., 2 * s.head_rows + 2 * s.state :].copy_(
        ddt.view(s.b, s.l, s.groups, heads_per_group))
    # The convolution: x's, B's and C's input columns of dproj, and partial sums of its parameters' gradients.
    kernel = conv_weight.shape[1]
    tiles = s.b * _cdiv(s.l, _CONV_BLOCK_T)
    dw_part = torch.empty(tiles, kernel, s.channels, dtype=torch.float32, device=proj.device)
    db_part = torch.empty(tiles, s.channels, dtype=torch.float32, device=proj.device)
    grid = (tiles, _cdiv(s.channels, _CONV_BLOCK_C))
    dpre = act  # the recomputed convolution is not needed any more: its buffer takes the gradient before SiLU
    _conv_slope_kernel[grid](
        proj, conv_weight, conv_bias if conv_bias is not None else conv_weight, dact, dpre, dw_part, db_part, s.l,
        s.channels, *proj.stride()[:2], *dact.stride()[:2], **_constants(s), NSTATE=s.state, KERNEL=kernel,
        HAS_BIAS=conv_bias is not None, BLOCK_T=_CONV_BLOCK_T, BLOCK_C=_CONV_BLOCK_C)
    _conv_input_grad_kernel[grid](
        conv_weight, dpre, dproj, s.l, s.channels, *proj.stride()[:2], *dact.stride()[:2], **_constants(s),
        NSTATE=s.state, KERNEL=kernel, BLOCK_T=_CONV_BLOCK_T, BLOCK_C=_CONV_BLOCK_C)
    dconv_w = dw_part.sum(0).t().contiguous().to(conv_weight.dtype)
    dconv_b = db_part.sum(0).to(conv_bias.dtype if conv_bias is not None else conv_weight.dtype)
    return dproj, dconv_w, dconv_b, dA, dD, dbias, dnorm_part.sum(0).to(norm_weight.dtype)


@mamba_mixer_backward.register_fake
def _mamba_mixer_backward_fake(dout, proj, y, rstd, conv_weight, conv_bias, A, D, dt_bias, norm_weight, head_dim, state,
                               chunk_size):
    channels = conv_weight.shape[0]
    return (torch.empty_like(proj), torch.empty_like(conv_weight), conv_weight.new_empty(channels), torch.empty_like(A),
            torch.empty_like(D), torch.empty_like(dt_bias), torch.empty_like(norm_weight))


def _setup_context(ctx, inputs, output) -> None:
    proj, conv_weight, conv_bias, A, D, dt_bias, norm_weight, head_dim, state, chunk_size, _eps = inputs
    _, y, rstd = output
    ctx.save_for_backward(proj, y, rstd, conv_weight, conv_bias, A, D, dt_bias, norm_weight)
    ctx.sizes = (head_dim, state, chunk_size)
    ctx.has_bias = conv_bias is not None
    ctx.set_materialize_grads(False)  # y's and rstd's gradients are never used: no zeros made for them


def _backward(ctx, dout, _dy, _drstd):
    proj, y, rstd, conv_weight, conv_bias, A, D, dt_bias, norm_weight = ctx.saved_tensors
    dproj, dw, db, dA, dD, dbias, dnorm = mamba_mixer_backward(dout, proj, y, rstd, conv_weight, conv_bias, A, D,
                                                               dt_bias, norm_weight, *ctx.sizes)
    return dproj, dw, db if ctx.has_bias else None, dA, dD, dbias, dnorm, None, None, None, None


mamba_mixer.register_autograd(_backward, setup_context=_setup_context)
register_scratch("kenotron::mamba_mixer", lambda proj, w, b, A, D, bias, nw, p, n, chunk, eps: _scratch(
    proj, D, p, n, chunk, backward=False))
register_scratch("kenotron::mamba_mixer_backward", lambda dout, proj, y, rstd, w, b, A, D, bias, nw, p, n, chunk: _scratch(
    proj, D, p, n, chunk, backward=True))
