"""Mamba-2's SSD scan in Triton: the forward kernels and the pieces the backward recomputes.

Same inputs and outputs as models/common/ssd.py's `ssd_chunked` (whose docstring has the
math), in four kernels over chunks of Q positions (notation: b batch, c chunk, h head, g its
B/C group, P head size, N state size, cs the cumulative sum of dt·A inside a chunk):

1. `_dt_kernel`       dt = softplus(dt_raw + bias) (0 past the sequence's end) and cs, in fp32,
                      one program per (b, h, c).
2. `_scores_kernel`   C·B^T inside each chunk, per group (the heads of a group share it), only
                      the blocks on and below the diagonal: (b, c, g, Q, Q) in fp32.
3. `_states_kernel`   per (b, h, N tile), chunk after chunk: the state entering each chunk is
                      stored (b, c, h, N, P) in fp32, then the chunk's own contribution
                      B^T (exp(cs_last - cs) dt x) is added to the decayed state. Sequential
                      over the chunks of a sequence, parallel over everything else.
4. `_output_kernel`   per (b, c, h, block of rows): y = exp(cs_i) C_i H + sum over j <= i of
                      (C_i.B_j) exp(cs_i - cs_j) dt_j x_j + D x_i.

Products run on the tensor cores in the inputs' dtype (bf16 in training) with fp32
accumulation; decays, cumulative sums and states are fp32. Inputs may be strided views (the
mixer hands slices of one projection) as long as their last dimension is contiguous.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _log1p(u):
    # log(1 + u) accurate for small u (Goldberg): log(w) * u / (w - 1) with w = 1 + u rounded.
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))


@triton.jit
def _softplus(v):
    # torch's threshold: softplus(v) = v above 20.
    return tl.where(v > 20.0, v, _log1p(tl.exp(tl.minimum(v, 20.0))))


@triton.jit
def _dt_kernel(dt_ptr, bias_ptr, A_ptr, dt_out_ptr, cs_ptr, seqlen, nheads, nchunks,
               s_dt_b, s_dt_l, s_dt_h, CHUNK: tl.constexpr):
    pid_bh, c = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // nheads, pid_bh % nheads
    t = c * CHUNK + tl.arange(0, CHUNK)
    valid = t < seqlen
    raw = tl.load(dt_ptr + b * s_dt_b + t * s_dt_l + h * s_dt_h, mask=valid, other=0.0).to(tl.float32)
    dt = tl.where(valid, _softplus(raw + tl.load(bias_ptr + h).to(tl.float32)), 0.0)
    cs = tl.cumsum(dt * tl.load(A_ptr + h).to(tl.float32), axis=0)
    row = pid_bh * nchunks * CHUNK + t
    tl.store(dt_out_ptr + row, dt)
    tl.store(cs_ptr + row, cs)


@triton.jit
def _scores_kernel(B_ptr, C_ptr, cb_ptr, seqlen, ngroups, nchunks, s_b_b, s_b_l, s_b_g, s_c_b, s_c_l, s_c_g,
                   CHUNK: tl.constexpr, NSTATE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    pid_bcg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid_n > pid_m:
        return
    b, c, g = pid_bcg // (nchunks * ngroups), (pid_bcg // ngroups) % nchunks, pid_bcg % ngroups
    rows = c * CHUNK + pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = c * CHUNK + pid_n * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, NSTATE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        cc = tl.load(C_ptr + b * s_c_b + rows[:, None] * s_c_l + g * s_c_g + k[None, :],
                     mask=rows[:, None] < seqlen, other=0.0)
        bb = tl.load(B_ptr + b * s_b_b + cols[None, :] * s_b_l + g * s_b_g + k[:, None],
                     mask=cols[None, :] < seqlen, other=0.0)
        acc += tl.dot(cc, bb, input_precision=PRECISION)
    i = pid_m * BLOCK + tl.arange(0, BLOCK)
    j = pid_n * BLOCK + tl.arange(0, BLOCK)
    tl.store(cb_ptr + pid_bcg * CHUNK * CHUNK + i[:, None] * CHUNK + j[None, :], acc)


@triton.jit
def _states_kernel(x_ptr, B_ptr, dt_ptr, cs_ptr, states_ptr, seqlen, nheads, ngroups, nchunks,
                   s_x_b, s_x_l, s_x_h, s_b_b, s_b_l, s_b_g,
                   CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh, pid_n = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // nheads, pid_bh % nheads
    g = h // (nheads // ngroups)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p = tl.arange(0, HEADDIM)
    state = tl.zeros((BLOCK_N, HEADDIM), dtype=tl.float32)
    for c in range(nchunks):
        out = states_ptr + ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM
        tl.store(out + n[:, None] * HEADDIM + p[None, :], state)
        row0 = pid_bh * nchunks * CHUNK + c * CHUNK
        cs_last = tl.load(cs_ptr + row0 + CHUNK - 1)
        acc = tl.zeros((BLOCK_N, HEADDIM), dtype=tl.float32)
        for k0 in range(0, CHUNK, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            t = c * CHUNK + k
            w = tl.exp(cs_last - tl.load(cs_ptr + row0 + k)) * tl.load(dt_ptr + row0 + k)
            bt = tl.load(B_ptr + b * s_b_b + t[None, :] * s_b_l + g * s_b_g + n[:, None],
                         mask=t[None, :] < seqlen, other=0.0)
            xx = tl.load(x_ptr + b * s_x_b + t[:, None] * s_x_l + h * s_x_h + p[None, :],
                         mask=t[:, None] < seqlen, other=0.0)
            acc += tl.dot((bt * w[None, :]).to(xx.dtype), xx, input_precision=PRECISION)
        state = state * tl.exp(cs_last) + acc


@triton.jit
def _output_kernel(x_ptr, C_ptr, cb_ptr, dt_ptr, cs_ptr, states_ptr, D_ptr, y_ptr, seqlen, nheads, ngroups, nchunks,
                   s_x_b, s_x_l, s_x_h, s_c_b, s_c_l, s_c_g, s_y_b, s_y_l, s_y_h,
                   CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_bch, pid_m = tl.program_id(0), tl.program_id(1)
    b, c, h = pid_bch // (nchunks * nheads), (pid_bch // nheads) % nchunks, pid_bch % nheads
    g = h // (nheads // ngroups)
    i = pid_m * BLOCK + tl.arange(0, BLOCK)
    t_i = c * CHUNK + i
    p = tl.arange(0, HEADDIM)
    row0 = (b * nheads + h) * nchunks * CHUNK + c * CHUNK
    cs_i = tl.load(cs_ptr + row0 + i)
    # From the state entering the chunk: exp(cs_i) C_i H.
    acc = tl.zeros((BLOCK, HEADDIM), dtype=tl.float32)
    state = states_ptr + ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM
    for k0 in range(0, NSTATE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        cc = tl.load(C_ptr + b * s_c_b + t_i[:, None] * s_c_l + g * s_c_g + k[None, :],
                     mask=t_i[:, None] < seqlen, other=0.0)
        hh = tl.load(state + k[:, None] * HEADDIM + p[None, :])
        acc += tl.dot(cc, hh.to(cc.dtype), input_precision=PRECISION)
    acc = acc * tl.exp(cs_i)[:, None]
    # Inside the chunk, blocks of columns up to the diagonal.
    for j0 in range(0, (pid_m + 1) * BLOCK, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        t_j = c * CHUNK + j
        s = tl.load(cb_ptr + ((b * nchunks + c) * ngroups + g) * CHUNK * CHUNK + i[:, None] * CHUNK + j[None, :])
        gap = tl.where(i[:, None] >= j[None, :], cs_i[:, None] - tl.load(cs_ptr + row0 + j)[None, :], float("-inf"))
        s = s * tl.exp(gap) * tl.load(dt_ptr + row0 + j)[None, :]
        xx = tl.load(x_ptr + b * s_x_b + t_j[:, None] * s_x_l + h * s_x_h + p[None, :],
                     mask=t_j[:, None] < seqlen, other=0.0)
        acc += tl.dot(s.to(xx.dtype), xx, input_precision=PRECISION)
    xi = tl.load(x_ptr + b * s_x_b + t_i[:, None] * s_x_l + h * s_x_h + p[None, :], mask=t_i[:, None] < seqlen,
                 other=0.0)
    y = acc + tl.load(D_ptr + h).to(tl.float32) * xi.to(tl.float32)
    tl.store(y_ptr + b * s_y_b + t_i[:, None] * s_y_l + h * s_y_h + p[None, :], y.to(y_ptr.dtype.element_ty),
             mask=t_i[:, None] < seqlen)
