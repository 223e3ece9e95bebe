"""Triton kernels for the Mamba-2 mixer's pieces around the scan (the op that runs them:
mamba_mixer_op.py): the causal depthwise convolution + SiLU and the gated RMSNorm, each direction.

They read the in-projection's output `proj` (rows of G groups of R = [z, x, B, C, dt] columns,
models/common/mamba.py's layout) where it lies, so nothing is sliced out or concatenated:

- `_conv_forward_kernel`  silu(conv(x, B, C columns of proj)) into `act`, laid out [x | B | C]
                          (heads' x in head order, then every group's B, then every group's C),
                          so that the scan reads x, B and C as plain strided views.
- `_conv_slope_kernel`   backward: recomputes the convolution, the gradient before SiLU
                          (into a buffer laid out as act), per-tile partial sums of the weight's
                          and bias's gradients (added up by the caller);
  `_conv_input_grad_kernel` then the input's gradient, into the same columns of `dproj`.
- `_gated_norm_forward_kernel`  out = RMSNorm(y * silu(z)) * w per group, and 1/rms per row and group.
- `_gated_norm_backward_kernel` dy, dz (into dproj's z columns), per-program partial sums of dw.

Arithmetic is fp32; inputs and outputs keep the activations' dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _xbc_columns(c, GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NSTATE: tl.constexpr, NGROUPS: tl.constexpr):
    """Convolution channel c (group-major [x, B, C] per group) -> (its column in proj, its column in act)."""
    width = HEAD_ROWS + 2 * NSTATE
    g = c // width
    r = c % width
    src = g * GROUP_ROWS + HEAD_ROWS + r
    dst = tl.where(r < HEAD_ROWS, g * HEAD_ROWS + r,
                   tl.where(r < HEAD_ROWS + NSTATE, NGROUPS * HEAD_ROWS + g * NSTATE + (r - HEAD_ROWS),
                            NGROUPS * (HEAD_ROWS + NSTATE) + g * NSTATE + (r - HEAD_ROWS - NSTATE)))
    return src, dst


@triton.jit
def _conv_tile(pid_bt, pid_c, seqlen, channels, GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr,
               NSTATE: tl.constexpr, NGROUPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """A convolution program's tile: its sequence b, positions t, channels c (valid where cmask)
    and their columns in proj and act."""
    n_t = tl.cdiv(seqlen, BLOCK_T)
    t = (pid_bt % n_t) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    src, dst = _xbc_columns(c, GROUP_ROWS, HEAD_ROWS, NSTATE, NGROUPS)
    return pid_bt // n_t, t, c, c < channels, src, dst


@triton.jit
def _conv_pre(proj_ptr, w_ptr, bias_ptr, b, t, c, src, cmask, seqlen, s_p_b, s_p_l,
              KERNEL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """The convolution before SiLU at positions t (BLOCK_T) and channels c (BLOCK_C), in fp32."""
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for k in tl.static_range(KERNEL):
        ts = t - (KERNEL - 1) + k
        xv = tl.load(proj_ptr + b * s_p_b + ts[:, None] * s_p_l + src[None, :],
                     mask=((ts >= 0) & (ts < seqlen))[:, None] & cmask[None, :], other=0.0)
        wk = tl.load(w_ptr + c * KERNEL + k, mask=cmask, other=0.0)
        acc += xv.to(tl.float32) * wk.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _conv_forward_kernel(proj_ptr, w_ptr, bias_ptr, act_ptr, seqlen, channels, s_p_b, s_p_l, s_a_b, s_a_l,
                         GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NSTATE: tl.constexpr,
                         NGROUPS: tl.constexpr, KERNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_bt = tl.program_id(0)
    b, t, c, cmask, src, dst = _conv_tile(pid_bt, tl.program_id(1), seqlen, channels, GROUP_ROWS, HEAD_ROWS, NSTATE,
                                          NGROUPS, BLOCK_T, BLOCK_C)
    pre = _conv_pre(proj_ptr, w_ptr, bias_ptr, b, t, c, src, cmask, seqlen, s_p_b, s_p_l, KERNEL, HAS_BIAS, BLOCK_T, BLOCK_C)
    out = pre * tl.sigmoid(pre)
    tl.store(act_ptr + b * s_a_b + t[:, None] * s_a_l + dst[None, :], out.to(act_ptr.dtype.element_ty),
             mask=(t < seqlen)[:, None] & cmask[None, :])


@triton.jit
def _conv_slope_kernel(proj_ptr, w_ptr, bias_ptr, dact_ptr, dpre_ptr, dw_part_ptr, db_part_ptr, seqlen, channels,
                       s_p_b, s_p_l, s_a_b, s_a_l,
                       GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NSTATE: tl.constexpr,
                       NGROUPS: tl.constexpr, KERNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """Backward, first pass: the gradient before SiLU, dpre_t = dout_t silu'(pre_t) (pre recomputed),
    into `dpre` (act's layout), and the tile's partial sums of the weight's and bias's gradients."""
    pid_bt = tl.program_id(0)
    b, t, c, cmask, src, dst = _conv_tile(pid_bt, tl.program_id(1), seqlen, channels, GROUP_ROWS, HEAD_ROWS, NSTATE,
                                          NGROUPS, BLOCK_T, BLOCK_C)
    inside = (t < seqlen)[:, None] & cmask[None, :]
    pre = _conv_pre(proj_ptr, w_ptr, bias_ptr, b, t, c, src, cmask, seqlen, s_p_b, s_p_l, KERNEL, HAS_BIAS,
                    BLOCK_T, BLOCK_C)
    g = tl.load(dact_ptr + b * s_a_b + t[:, None] * s_a_l + dst[None, :], mask=inside, other=0.0).to(tl.float32)
    sig = tl.sigmoid(pre)
    dpre = g * sig * (1.0 + pre * (1.0 - sig))
    tl.store(dpre_ptr + b * s_a_b + t[:, None] * s_a_l + dst[None, :], dpre.to(dpre_ptr.dtype.element_ty), mask=inside)
    # out_t = silu(sum_k w_k x_{t-K+1+k} + bias): w_k's gradient sums x_{t-K+1+k} dpre_t.
    part = pid_bt * KERNEL * channels
    for k in tl.static_range(KERNEL):
        ts = t - (KERNEL - 1) + k
        xv = tl.load(proj_ptr + b * s_p_b + ts[:, None] * s_p_l + src[None, :],
                     mask=((ts >= 0) & (ts < seqlen))[:, None] & cmask[None, :], other=0.0)
        tl.store(dw_part_ptr + part + k * channels + c, tl.sum(xv.to(tl.float32) * dpre, axis=0), mask=cmask)
    tl.store(db_part_ptr + pid_bt * channels + c, tl.sum(dpre, axis=0), mask=cmask)


@triton.jit
def _conv_input_grad_kernel(w_ptr, dpre_ptr, dproj_ptr, seqlen, channels, s_p_b, s_p_l, s_a_b, s_a_l,
                            GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NSTATE: tl.constexpr,
                            NGROUPS: tl.constexpr, KERNEL: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_C: tl.constexpr):
    """Backward, second pass: x_s receives w_k dpre_{s+K-1-k}, written into dproj's x, B and C columns."""
    pid_bt = tl.program_id(0)
    b, t, c, cmask, src, dst = _conv_tile(pid_bt, tl.program_id(1), seqlen, channels, GROUP_ROWS, HEAD_ROWS, NSTATE,
                                          NGROUPS, BLOCK_T, BLOCK_C)
    dx = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(KERNEL):
        tj = t + j
        dpre = tl.load(dpre_ptr + b * s_a_b + tj[:, None] * s_a_l + dst[None, :],
                       mask=(tj < seqlen)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        dx += dpre * tl.load(w_ptr + c * KERNEL + (KERNEL - 1 - j), mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(dproj_ptr + b * s_p_b + t[:, None] * s_p_l + src[None, :], dx.to(dproj_ptr.dtype.element_ty),
             mask=(t < seqlen)[:, None] & cmask[None, :])


@triton.jit
def _gated_norm_forward_kernel(y_ptr, proj_ptr, w_ptr, out_ptr, rstd_ptr, s_y_row, s_p_row, s_o_row, eps,
                               GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NGROUPS: tl.constexpr,
                               BLOCK: tl.constexpr):
    row, g = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < HEAD_ROWS
    y = tl.load(y_ptr + row * s_y_row + g * HEAD_ROWS + i, mask=m, other=0.0).to(tl.float32)
    z = tl.load(proj_ptr + row * s_p_row + g * GROUP_ROWS + i, mask=m, other=0.0).to(tl.float32)
    gated = y * z * tl.sigmoid(z)
    rstd = 1.0 / tl.sqrt(tl.sum(gated * gated, axis=0) / HEAD_ROWS + eps)
    w = tl.load(w_ptr + g * HEAD_ROWS + i, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * s_o_row + g * HEAD_ROWS + i, (gated * rstd * w).to(out_ptr.dtype.element_ty), mask=m)
    tl.store(rstd_ptr + row * NGROUPS + g, rstd)


@triton.jit
def _gated_norm_backward_kernel(dout_ptr, y_ptr, proj_ptr, w_ptr, rstd_ptr, dy_ptr, dproj_ptr, dw_part_ptr, rows,
                                s_d_row, s_y_row, s_p_row, s_dy_row,
                                GROUP_ROWS: tl.constexpr, HEAD_ROWS: tl.constexpr, NGROUPS: tl.constexpr,
                                ROWS_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr):
    pid, g = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < HEAD_ROWS
    w = tl.load(w_ptr + g * HEAD_ROWS + i, mask=m, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(ROWS_PER_PROGRAM):
        # Rows past the end (the last program's) redo the last row and store nothing.
        row = tl.minimum(pid * ROWS_PER_PROGRAM + r, rows - 1)
        ok = m & (pid * ROWS_PER_PROGRAM + r + 0 * i < rows)
        grad = tl.load(dout_ptr + row * s_d_row + g * HEAD_ROWS + i, mask=ok, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row * s_y_row + g * HEAD_ROWS + i, mask=m, other=0.0).to(tl.float32)
        z = tl.load(proj_ptr + row * s_p_row + g * GROUP_ROWS + i, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row * NGROUPS + g)
        sig = tl.sigmoid(z)
        silu = z * sig
        normed = y * silu * rstd
        dw += grad * normed
        dn = grad * w
        dgated = rstd * (dn - normed * (tl.sum(dn * normed, axis=0) / HEAD_ROWS))
        tl.store(dy_ptr + row * s_dy_row + g * HEAD_ROWS + i, (dgated * silu).to(dy_ptr.dtype.element_ty), mask=ok)
        dz = dgated * y * sig * (1.0 + z * (1.0 - sig))
        tl.store(dproj_ptr + row * s_p_row + g * GROUP_ROWS + i, dz.to(dproj_ptr.dtype.element_ty), mask=ok)
    tl.store(dw_part_ptr + pid * NGROUPS * HEAD_ROWS + g * HEAD_ROWS + i, dw, mask=m)
