"""The SSD scan's backward in Triton (the forward and the notation: ssd.py).

The backward first reruns the forward's dt, scores and states kernels (cheaper than keeping a
state per chunk and head for every layer), then:

1. `_state_grad_kernel`  per (b, h, N tile), chunks in reverse: the gradient of the state at
                         each chunk's end, dH_{c-1} = exp(cs_last) dH_c + sum_i exp(cs_i) C_i^T dy_i,
                         and the decay's share <dH_c, H_{c-1}> exp(cs_last).
2. `_score_grad_kernel`  per (b, c, g, block pair on or below the diagonal), summed over the
                         group's heads: dCB_ij = sum_h (dy_i.x_j) exp(cs_i - cs_j) dt_j, and per
                         head the d cs of each pair, M_ij = dCB_ij^h CB_ij, summed into +d cs_i
                         and -d cs_j (the same fp32 numbers on both ends: bf16 inputs then lose
                         nothing in the difference that the gradient of dt·A is).
3. `_x_grad_kernel`      per (b, c, h, block of columns j): the gradient reaching dt_j x_j from
                         later positions (CB^T and the decays) and from the chunk's end state
                         (B_j dH_c): dx, ddt, and the partial sums for dD and d cs_last.
4. `_c_grad_kernel`      per (b, c, g, block of rows, split of heads): dC from the entering
                         states (exp(cs_i) dy_i H^T) and from dCB B; d cs_i of the entering state.
   `_b_grad_kernel`      likewise dB from the end states (dt_j exp(cs_last - cs_j) x_j dH^T) and
                         dCB^T C.
5. `_dt_grad_kernel`     per (b, h, c): the gradients of cs gathered, summed backwards into those
                         of dt·A, then through the softplus to dt_raw, and the sums for dA and the bias.

Partial sums are written per block and added up by the caller (no atomics: deterministic).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _state_grad_kernel(dy_ptr, C_ptr, cs_ptr, states_ptr, dstates_ptr, ddecay_ptr, seqlen, nheads, ngroups, nchunks,
                       s_dy_b, s_dy_l, s_dy_h, s_c_b, s_c_l, s_c_g,
                       CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh, pid_n = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // nheads, pid_bh % nheads
    g = h // (nheads // ngroups)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p = tl.arange(0, HEADDIM)
    n_tiles = NSTATE // BLOCK_N
    dstate = tl.zeros((BLOCK_N, HEADDIM), dtype=tl.float32)
    for back in range(nchunks):
        c = nchunks - 1 - back
        offset = ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM + n[:, None] * HEADDIM + p[None, :]
        tl.store(dstates_ptr + offset, dstate)
        row0 = pid_bh * nchunks * CHUNK + c * CHUNK
        decay = tl.exp(tl.load(cs_ptr + row0 + CHUNK - 1))
        entering = tl.load(states_ptr + offset)
        tl.store(ddecay_ptr + (pid_bh * nchunks + c) * n_tiles + pid_n, tl.sum(dstate * entering) * decay)
        acc = tl.zeros((BLOCK_N, HEADDIM), dtype=tl.float32)
        for k0 in range(0, CHUNK, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            t = c * CHUNK + k
            e = tl.exp(tl.load(cs_ptr + row0 + k))
            ct = tl.load(C_ptr + b * s_c_b + t[None, :] * s_c_l + g * s_c_g + n[:, None],
                         mask=t[None, :] < seqlen, other=0.0)
            dyy = tl.load(dy_ptr + b * s_dy_b + t[:, None] * s_dy_l + h * s_dy_h + p[None, :],
                          mask=t[:, None] < seqlen, other=0.0)
            acc += tl.dot((ct * e[None, :]).to(dyy.dtype), dyy, input_precision=PRECISION)
        dstate = dstate * decay + acc


@triton.jit
def _score_grad_kernel(dy_ptr, x_ptr, cb_ptr, dt_ptr, cs_ptr, dcb_ptr, dcs_part_ptr, dsrc_part_ptr, seqlen, nheads,
                       ngroups, nchunks,
                       s_dy_b, s_dy_l, s_dy_h, s_x_b, s_x_l, s_x_h,
                       CHUNK: tl.constexpr, HEADDIM: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    pid_bcg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid_n > pid_m:
        return
    b, c, g = pid_bcg // (nchunks * ngroups), (pid_bcg // ngroups) % nchunks, pid_bcg % ngroups
    group_heads = nheads // ngroups
    i = pid_m * BLOCK + tl.arange(0, BLOCK)
    j = pid_n * BLOCK + tl.arange(0, BLOCK)
    t_i, t_j = c * CHUNK + i, c * CHUNK + j
    p = tl.arange(0, HEADDIM)
    scores = tl.load(cb_ptr + pid_bcg * CHUNK * CHUNK + i[:, None] * CHUNK + j[None, :])
    causal = i[:, None] >= j[None, :]
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(group_heads):
        h = g * group_heads + k
        row0 = (b * nheads + h) * nchunks * CHUNK + c * CHUNK
        dyi = tl.load(dy_ptr + b * s_dy_b + t_i[:, None] * s_dy_l + h * s_dy_h + p[None, :],
                      mask=t_i[:, None] < seqlen, other=0.0)
        xj = tl.load(x_ptr + b * s_x_b + t_j[None, :] * s_x_l + h * s_x_h + p[:, None],
                     mask=t_j[None, :] < seqlen, other=0.0)
        gap = tl.where(causal, tl.load(cs_ptr + row0 + i)[:, None] - tl.load(cs_ptr + row0 + j)[None, :], float("-inf"))
        w = tl.dot(dyi, xj, input_precision=PRECISION) * tl.exp(gap) * tl.load(dt_ptr + row0 + j)[None, :]
        acc += w
        # d cs of each pair, +M_ij at the later end i and -M_ij at the earlier end j, from the same
        # fp32 products, so that their difference (the gradient of dt·A) keeps fp32's precision.
        pairs = w * scores
        head_chunk = ((b * nheads + h) * nchunks + c) * (CHUNK // BLOCK)
        tl.store(dcs_part_ptr + (head_chunk + pid_n) * CHUNK + i, tl.sum(pairs, axis=1))
        tl.store(dsrc_part_ptr + (head_chunk + pid_m) * CHUNK + j, tl.sum(pairs, axis=0))
    tl.store(dcb_ptr + pid_bcg * CHUNK * CHUNK + i[:, None] * CHUNK + j[None, :], acc)


@triton.jit
def _x_grad_kernel(x_ptr, dy_ptr, B_ptr, cb_ptr, dt_ptr, cs_ptr, dstates_ptr, D_ptr, dx_ptr, ddt_ptr, ddt_state_ptr,
                   dD_part_ptr, dlast_part_ptr, seqlen, nheads, ngroups, nchunks,
                   s_x_b, s_x_l, s_x_h, s_dy_b, s_dy_l, s_dy_h, s_b_b, s_b_l, s_b_g, s_dx_b, s_dx_l, s_dx_h,
                   CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_bch, pid_j = tl.program_id(0), tl.program_id(1)
    b, c, h = pid_bch // (nchunks * nheads), (pid_bch // nheads) % nchunks, pid_bch % nheads
    g = h // (nheads // ngroups)
    j = pid_j * BLOCK + tl.arange(0, BLOCK)
    t_j = c * CHUNK + j
    p = tl.arange(0, HEADDIM)
    row0 = (b * nheads + h) * nchunks * CHUNK + c * CHUNK
    cs_j = tl.load(cs_ptr + row0 + j)
    dt_j = tl.load(dt_ptr + row0 + j)
    xj = tl.load(x_ptr + b * s_x_b + t_j[:, None] * s_x_l + h * s_x_h + p[None, :], mask=t_j[:, None] < seqlen,
                 other=0.0)
    # From the state at the chunk's end: exp(cs_last - cs_j) B_j dH.
    acc = tl.zeros((BLOCK, HEADDIM), dtype=tl.float32)
    dstate = dstates_ptr + ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM
    for k0 in range(0, NSTATE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        bb = tl.load(B_ptr + b * s_b_b + t_j[:, None] * s_b_l + g * s_b_g + k[None, :],
                     mask=t_j[:, None] < seqlen, other=0.0)
        dh = tl.load(dstate + k[:, None] * HEADDIM + p[None, :])
        acc += tl.dot(bb, dh.to(bb.dtype), input_precision=PRECISION)
    acc = acc * tl.exp(tl.load(cs_ptr + row0 + CHUNK - 1) - cs_j)[:, None]
    ddt_state = tl.sum(acc * xj.to(tl.float32), axis=1)
    tl.store(ddt_state_ptr + row0 + j, ddt_state)
    tl.store(dlast_part_ptr + pid_bch * (CHUNK // BLOCK) + pid_j, tl.sum(ddt_state * dt_j))
    # From later positions of the chunk: sum over i >= j of CB_ij exp(cs_i - cs_j) dy_i.
    for i0 in range(pid_j * BLOCK, CHUNK, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        t_i = c * CHUNK + i
        scores_t = tl.load(cb_ptr + ((b * nchunks + c) * ngroups + g) * CHUNK * CHUNK + i[None, :] * CHUNK + j[:, None])
        gap = tl.where(i[None, :] >= j[:, None], tl.load(cs_ptr + row0 + i)[None, :] - cs_j[:, None], float("-inf"))
        dyi = tl.load(dy_ptr + b * s_dy_b + t_i[:, None] * s_dy_l + h * s_dy_h + p[None, :],
                      mask=t_i[:, None] < seqlen, other=0.0)
        acc += tl.dot((scores_t * tl.exp(gap)).to(dyi.dtype), dyi, input_precision=PRECISION)
    tl.store(ddt_ptr + row0 + j, tl.sum(acc * xj.to(tl.float32), axis=1))
    dyj = tl.load(dy_ptr + b * s_dy_b + t_j[:, None] * s_dy_l + h * s_dy_h + p[None, :], mask=t_j[:, None] < seqlen,
                  other=0.0).to(tl.float32)
    dx = acc * dt_j[:, None] + tl.load(D_ptr + h).to(tl.float32) * dyj
    tl.store(dx_ptr + b * s_dx_b + t_j[:, None] * s_dx_l + h * s_dx_h + p[None, :], dx.to(dx_ptr.dtype.element_ty),
             mask=t_j[:, None] < seqlen)
    tl.store(dD_part_ptr + pid_bch * (CHUNK // BLOCK) + pid_j, tl.sum(dyj * xj.to(tl.float32)))


@triton.jit
def _c_grad_kernel(dy_ptr, C_ptr, B_ptr, dcb_ptr, cs_ptr, states_ptr, dC_part_ptr, dcs_off_ptr, seqlen, nheads,
                   ngroups, nchunks, split_heads,
                   s_dy_b, s_dy_l, s_dy_h, s_c_b, s_c_l, s_c_g, s_b_b, s_b_l, s_b_g,
                   CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK: tl.constexpr,
                   PRECISION: tl.constexpr):
    pid_bcg, pid_i, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, c, g = pid_bcg // (nchunks * ngroups), (pid_bcg // ngroups) % nchunks, pid_bcg % ngroups
    i = pid_i * BLOCK + tl.arange(0, BLOCK)
    t_i = c * CHUNK + i
    p = tl.arange(0, HEADDIM)
    n = tl.arange(0, NSTATE)
    cc = tl.load(C_ptr + b * s_c_b + t_i[:, None] * s_c_l + g * s_c_g + n[None, :], mask=t_i[:, None] < seqlen,
                 other=0.0)
    acc = tl.zeros((BLOCK, NSTATE), dtype=tl.float32)
    for k in range(split_heads):
        h = g * (nheads // ngroups) + split * split_heads + k
        row0 = (b * nheads + h) * nchunks * CHUNK + c * CHUNK
        dyi = tl.load(dy_ptr + b * s_dy_b + t_i[:, None] * s_dy_l + h * s_dy_h + p[None, :],
                      mask=t_i[:, None] < seqlen, other=0.0)
        state_t = tl.load(states_ptr + ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM + n[None, :] * HEADDIM
                          + p[:, None])
        part = tl.dot(dyi, state_t.to(dyi.dtype), input_precision=PRECISION) * tl.exp(tl.load(cs_ptr + row0 + i))[:, None]
        acc += part
        tl.store(dcs_off_ptr + row0 + i, tl.sum(part * cc.to(tl.float32), axis=1))
    if split == 0:
        for j0 in range(0, (pid_i + 1) * BLOCK, BLOCK):
            j = j0 + tl.arange(0, BLOCK)
            t_j = c * CHUNK + j
            dcb = tl.load(dcb_ptr + pid_bcg * CHUNK * CHUNK + i[:, None] * CHUNK + j[None, :])
            bb = tl.load(B_ptr + b * s_b_b + t_j[:, None] * s_b_l + g * s_b_g + n[None, :], mask=t_j[:, None] < seqlen,
                         other=0.0)
            acc += tl.dot(dcb.to(bb.dtype), bb, input_precision=PRECISION)
    out = dC_part_ptr + (split * tl.num_programs(0) + pid_bcg) * CHUNK * NSTATE
    tl.store(out + i[:, None] * NSTATE + n[None, :], acc)


@triton.jit
def _b_grad_kernel(x_ptr, B_ptr, C_ptr, dcb_ptr, dt_ptr, cs_ptr, dstates_ptr, dB_part_ptr, seqlen, nheads, ngroups,
                   nchunks, split_heads,
                   s_x_b, s_x_l, s_x_h, s_c_b, s_c_l, s_c_g,
                   CHUNK: tl.constexpr, HEADDIM: tl.constexpr, NSTATE: tl.constexpr, BLOCK: tl.constexpr,
                   PRECISION: tl.constexpr):
    pid_bcg, pid_j, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, c, g = pid_bcg // (nchunks * ngroups), (pid_bcg // ngroups) % nchunks, pid_bcg % ngroups
    j = pid_j * BLOCK + tl.arange(0, BLOCK)
    t_j = c * CHUNK + j
    p = tl.arange(0, HEADDIM)
    n = tl.arange(0, NSTATE)
    acc = tl.zeros((BLOCK, NSTATE), dtype=tl.float32)
    for k in range(split_heads):
        h = g * (nheads // ngroups) + split * split_heads + k
        row0 = (b * nheads + h) * nchunks * CHUNK + c * CHUNK
        xj = tl.load(x_ptr + b * s_x_b + t_j[:, None] * s_x_l + h * s_x_h + p[None, :], mask=t_j[:, None] < seqlen,
                     other=0.0)
        dstate_t = tl.load(dstates_ptr + ((b * nchunks + c) * nheads + h) * NSTATE * HEADDIM + n[None, :] * HEADDIM
                           + p[:, None])
        w = tl.exp(tl.load(cs_ptr + row0 + CHUNK - 1) - tl.load(cs_ptr + row0 + j)) * tl.load(dt_ptr + row0 + j)
        acc += tl.dot(xj, dstate_t.to(xj.dtype), input_precision=PRECISION) * w[:, None]
    if split == 0:
        for i0 in range(pid_j * BLOCK, CHUNK, BLOCK):
            i = i0 + tl.arange(0, BLOCK)
            t_i = c * CHUNK + i
            dcb_t = tl.load(dcb_ptr + pid_bcg * CHUNK * CHUNK + i[None, :] * CHUNK + j[:, None])
            # The diagonal block's dCB is zero above the diagonal (its decays are).
            cc = tl.load(C_ptr + b * s_c_b + t_i[:, None] * s_c_l + g * s_c_g + n[None, :], mask=t_i[:, None] < seqlen,
                         other=0.0)
            acc += tl.dot(dcb_t.to(cc.dtype), cc, input_precision=PRECISION)
    out = dB_part_ptr + (split * tl.num_programs(0) + pid_bcg) * CHUNK * NSTATE
    tl.store(out + j[:, None] * NSTATE + n[None, :], acc)


@triton.jit
def _dt_grad_kernel(dt_raw_ptr, bias_ptr, A_ptr, dt_ptr, ddt_ptr, ddt_state_ptr, dcs_part_ptr, dsrc_part_ptr,
                    dcs_off_ptr, dlast_part_ptr, ddecay_ptr, ddt_raw_ptr, dA_part_ptr, dbias_part_ptr, seqlen, nheads, nchunks,
                    s_dt_b, s_dt_l, s_dt_h, s_o_b, s_o_l, s_o_h,
                    CHUNK: tl.constexpr, BLOCKS: tl.constexpr, N_TILES: tl.constexpr):
    pid_bh, c = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // nheads, pid_bh % nheads
    k = tl.arange(0, CHUNK)
    t = c * CHUNK + k
    valid = t < seqlen
    row0 = (pid_bh * nchunks + c) * CHUNK
    dt = tl.load(dt_ptr + row0 + k)
    ddt = tl.load(ddt_ptr + row0 + k)
    # d cs: as the later end of a decay (the scores' and the entering state's), minus as the
    # earlier end (of the scores', and of the end state's: dt_j x_j times its share of ddt),
    # plus the chunk's last position's share in the decay of the end state and of the next chunk's.
    dcs = tl.load(dcs_off_ptr + row0 + k) - dt * tl.load(ddt_state_ptr + row0 + k)
    for blk in range(BLOCKS):
        part = ((pid_bh * nchunks + c) * BLOCKS + blk) * CHUNK + k
        dcs += tl.load(dcs_part_ptr + part) - tl.load(dsrc_part_ptr + part)
    last = tl.sum(tl.load(dlast_part_ptr + (b * nchunks + c) * nheads * BLOCKS + h * BLOCKS + tl.arange(0, BLOCKS)))
    last += tl.sum(tl.load(ddecay_ptr + (pid_bh * nchunks + c) * N_TILES + tl.arange(0, N_TILES)))
    dcs += tl.where(k == CHUNK - 1, last, 0.0)
    # cs_k = sum_{m <= k} a_m, so da_m = sum_{k >= m} dcs_k.
    da = tl.sum(dcs) - tl.cumsum(dcs, axis=0) + dcs
    A = tl.load(A_ptr + h).to(tl.float32)
    tl.store(dA_part_ptr + pid_bh * nchunks + c, tl.sum(dt * da))
    v = tl.load(dt_raw_ptr + b * s_dt_b + t * s_dt_l + h * s_dt_h, mask=valid, other=0.0).to(tl.float32)
    v += tl.load(bias_ptr + h).to(tl.float32)
    slope = tl.where(v > 20.0, 1.0, 1.0 / (1.0 + tl.exp(-v)))
    draw = tl.where(valid, (ddt + A * da) * slope, 0.0)
    tl.store(ddt_raw_ptr + b * s_o_b + t * s_o_l + h * s_o_h, draw.to(ddt_raw_ptr.dtype.element_ty), mask=valid)
    tl.store(dbias_part_ptr + pid_bh * nchunks + c, tl.sum(draw))
