"""The closed-form memory of a Mamba-2 block (models/common/mamba.py), beside analytic.py's
attention block: what it keeps for backward and the scratch of its backward, per rank.

Notation as in analytic.py (T tokens, T_r under sequence parallel, t = tp, c compute bytes,
c_r residual bytes); I = heads·P inner width, G groups, N state, R = 2·I + 2·G·N + heads
in-projection rows, K = I + 2·G·N convolution channels, all divided by t on a rank; Q the
chunk, L_p = T rounded up to chunks.

Kept per block (the Triton mixer op, kernels/mamba_mixer_op.py, which keeps the in-projection's
output, the scan's output and the norm's 1/rms, and recomputes the convolution):
  none: T_r·d·c_r (block input, saved by the norm) + T_r·4 (its rstd) + T·d·c (the norm's output
        or its sequence-parallel all-gather, saved by the in-projection; a bf16 copy under
        autocast) + T·R·c (the in-projection's output) + T·I·c (the scan's output) + T·I·c (the
        gated norm's output, kept by the out-projection) + T·G·4 (its 1/rms per group).
  full: the block input.
  selective-op: the block input, the two matmul outputs (T·R·c, T·d·c), the op's three outputs
        (2·T·I·c + T·G·4), and under sequence parallel the all-gather and reduce-scatter outputs.
Backward scratch of one block, the op's backward at its peak (the scan's backward): the incoming
gradient and the scan output's (2·T·I·c), the in-projection output's gradient (T·R·c), the
recomputed convolution and its gradient (2·T·K·c), dt's gradient (T·H·c), the gated norm's
weight-gradient partial sums (T/32·I·4), and the scan's fp32 workspace (states and their
gradients 2·b·n_c·H·N·P, scores and theirs 2·b·n_c·G·Q², the d cs partial sums
2·b·H·L_p·Q/64 + 6·b·H·L_p, dB/dC partial sums 2·S·b·L_p·G·N).
"""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.estimate.breakdown import allocated_bytes

FP32 = 4


@dataclass(frozen=True)
class MambaDims:
    """One rank's share of a Mamba-2 mixer (tensor parallel splits heads and groups)."""

    heads: int
    head_dim: int
    groups: int
    state: int
    chunk: int

    @classmethod
    def of(cls, args, tp: int) -> MambaDims:
        return cls(args.ssm_heads // tp, args.ssm_head_dim, args.ssm_groups // tp, args.ssm_state, args.chunk_size)

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def proj(self) -> int:
        return 2 * self.inner + 2 * self.groups * self.state + self.heads

    @property
    def conv(self) -> int:
        return self.inner + 2 * self.groups * self.state


def mamba_block_activations(s, m: MambaDims, mode: str, sp: bool, save_matmul_every: int = 1) -> int:
    """Bytes one Mamba block keeps for backward under AC `mode` (see the module doc); `s` is
    analytic.StepShape."""
    T, Tr, c = s.tokens, s.residual_tokens, s.compute
    block_input = allocated_bytes(Tr * s.dim * s.residual)
    if mode == "full":
        return block_input
    op_outputs = 2 * allocated_bytes(T * m.inner * c) + allocated_bytes(T * m.groups * FP32)
    if mode == "selective-op":
        matmuls = [allocated_bytes(T * m.proj * c), allocated_bytes(T * s.dim * c)]
        comms = allocated_bytes(T * s.dim * c) + allocated_bytes(Tr * s.dim * c) if sp else 0
        return block_input + sum(matmuls[::save_matmul_every]) + op_outputs + comms
    norm_out = allocated_bytes(T * s.dim * (2 if s.autocast else c))
    return block_input + allocated_bytes(Tr * FP32) + norm_out + allocated_bytes(T * m.proj * c) + op_outputs


def mamba_backward_scratch(s, m: MambaDims) -> int:
    """Bytes of one Mamba block's backward beyond what it keeps (see the module doc)."""
    T, c = s.tokens, s.compute
    chunks = -(-s.seq // m.chunk)
    padded = s.batch * chunks * m.chunk
    group_heads = m.heads // max(m.groups, 1)
    splits = next(k for k in (8, 4, 2, 1) if group_heads % k == 0)
    workspace = (2 * allocated_bytes(s.batch * chunks * m.heads * m.state * m.head_dim * FP32)
                 + 2 * allocated_bytes(s.batch * chunks * m.groups * m.chunk * m.chunk * FP32)
                 + 2 * allocated_bytes(padded * m.heads * max(m.chunk // 64, 1) * FP32)
                 + 6 * allocated_bytes(padded * m.heads * FP32)
                 + 2 * allocated_bytes(splits * padded * m.groups * m.state * FP32))
    return (2 * allocated_bytes(T * m.inner * c) + allocated_bytes(T * m.proj * c) + 2 * allocated_bytes(T * m.conv * c)
            + allocated_bytes(T * m.heads * c) + allocated_bytes(-(-T // 32) * m.inner * FP32) + workspace)
