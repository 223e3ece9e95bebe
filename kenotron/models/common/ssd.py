"""Mamba-2's state-space scan (SSD, "state space duality") in plain PyTorch: the chunked form
for training and prefill, and the one-token recurrence for decoding.

Per head h, with a scalar decay a_t = dt_t * A_h (A_h < 0) and the head's group g supplying
B_t, C_t (state size N), the recurrence over positions t is

    S_t = exp(a_t) * S_{t-1} + dt_t * x_t B_t^T        (S: head_dim x N)
    y_t = S_t C_t + D_h * x_t

with dt_t = softplus(dt_raw_t + dt_bias_h). The chunked form cuts the sequence into chunks of
Q positions: inside a chunk, y is an attention-like product (C_i . B_j) exp(cs_i - cs_j)
dt_j x_j over j <= i (cs: the cumulative sum of a within the chunk); across chunks, one
state per chunk carries the rest. It is exact (no approximation of the recurrence) and made
of batched matrix products, so it runs on the CPU and compiles on a GPU; its Q x Q decay
matrices per head make it heavy on memory, which the Triton kernels of kenotron/kernels/ssd*.py
avoid on CUDA (same inputs and outputs: see `ssd_chunked`'s signature).

Everything is computed in fp32; the output takes x's dtype. States are (batch, heads,
head_dim, N) in fp32, the layout of mamba_ssm's and transformers' caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _chunked(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """(b, l, ...) zero-padded to a multiple of `chunk` and viewed as (b, chunks, chunk, ...)."""
    pad = (-t.shape[1]) % chunk
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.view(t.shape[0], -1, chunk, *t.shape[2:])


def _cumsum_by_doubling(t: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sum along the last dimension in log2(n) shifted additions
    (Hillis-Steele). Not torch.cumsum: inside a compiled block on CUDA, Inductor's code for that
    scan (its split scan) fails to generate at the published chunk sizes (torch 2.11); additions
    compile everywhere, and their tree order sums as precisely as a sequential one."""
    shift = 1
    while shift < t.shape[-1]:
        t = t + F.pad(t[..., :-shift], (shift, 0))
        shift *= 2
    return t


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The scan over a whole sequence.

    x (b, l, heads, head_dim); dt (b, l, heads) before softplus; A, D, dt_bias (heads,) with A
    negative; B, C (b, l, groups, N), heads split evenly over groups (head h uses group
    h // (heads / groups)); `initial_state` (b, heads, head_dim, N) or None for zeros.
    Returns y (b, l, heads, head_dim) in x's dtype, and the state after the last position
    when `return_final_state`.
    """
    b, length, heads, head_dim = x.shape
    groups = B.shape[2]
    per_group = heads // groups
    dt = F.softplus(dt.float() + dt_bias.float())  # (b, l, h)
    # Padding positions get dt = 0: no decay and no input, so the final state is the last real one's.
    xd = _chunked((x.float() * dt[..., None]).view(b, length, groups, per_group, head_dim), chunk_size)
    decay_steps = _chunked((dt * A.float()).view(b, length, groups, per_group), chunk_size)  # (b, c, Q, g, k)
    cs = _cumsum_by_doubling(decay_steps.movedim(2, -1)).movedim(-1, 2)
    Bc, Cc = _chunked(B.float(), chunk_size), _chunked(C.float(), chunk_size)  # (b, c, Q, g, n)
    Q = chunk_size

    # Inside each chunk: y_i = sum_{j <= i} (C_i . B_j) exp(cs_i - cs_j) dt_j x_j.
    scores = torch.einsum("bcign,bcjgn->bcgij", Cc, Bc)  # (b, c, g, Q, Q), shared by the group's heads
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    gap = cs[:, :, :, None] - cs[:, :, None, :]  # (b, c, i, j, g, k): cs_i - cs_j
    decay = torch.exp(gap.masked_fill(~causal[:, :, None, None], float("-inf")))
    y = torch.einsum("bcgij,bcijgk,bcjgkp->bcigkp", scores, decay, xd)

    # Each chunk's own contribution to the state at its end, then the state entering each chunk.
    to_end = torch.exp(cs[:, :, -1:] - cs)  # (b, c, Q, g, k)
    chunk_states = torch.einsum("bcjgn,bcjgk,bcjgkp->bcgkpn", Bc, to_end, xd)
    chunk_decay = torch.exp(cs[:, :, -1])  # (b, c, g, k)
    state = (
        initial_state.float().view(b, groups, per_group, head_dim, -1) if initial_state is not None
        else torch.zeros_like(chunk_states[:, 0])
    )
    entering = []
    for c in range(chunk_states.shape[1]):
        entering.append(state)
        state = state * chunk_decay[:, c, :, :, None, None] + chunk_states[:, c]
    states = torch.stack(entering, dim=1)  # (b, c, g, k, p, n)
    y = y + torch.einsum("bcign,bcgkpn,bcigk->bcigkp", Cc, states, torch.exp(cs))

    y = y.reshape(b, -1, heads, head_dim)[:, :length] + D.float()[:, None] * x.float()
    y = y.to(x.dtype)
    if return_final_state:
        return y, state.reshape(b, heads, head_dim, -1)
    return y


def ssd_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
) -> torch.Tensor:
    """One position of the recurrence, updating `state` (b, heads, head_dim, N) in place.

    x (b, heads, head_dim); dt (b, heads) before softplus; B, C (b, groups, N). Returns y
    (b, heads, head_dim) in x's dtype.
    """
    heads, groups = x.shape[1], B.shape[1]
    dt = F.softplus(dt.float() + dt_bias.float())
    Bh = B.float().repeat_interleave(heads // groups, dim=1)  # (b, h, n)
    Ch = C.float().repeat_interleave(heads // groups, dim=1)
    decay = torch.exp(dt * A.float())[..., None, None]
    new = state.float() * decay + (dt[..., None] * x.float())[..., None] * Bh[:, :, None, :]
    state.copy_(new)
    y = torch.einsum("bhpn,bhn->bhp", new, Ch) + D.float()[:, None] * x.float()
    return y.to(x.dtype)
