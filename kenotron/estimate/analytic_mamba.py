"""The closed-form memory of a Mamba-2 block (models/common/mamba.py), beside analytic.py's
attention block: what it keeps for backward and the scratch of its backward, per rank.

Notation as in analytic.py (T tokens, T_r under sequence parallel, t = tp, c compute bytes,
c_r residual bytes); I = heads·P inner width, G groups, N state, R = 2·I + 2·G·N + heads
in-projection rows, K = I + 2·G·N convolution channels, all divided by t on a rank; Q the
chunk, L_p = T rounded up to chunks.

Kept per block (eager, the Triton scan, which keeps only its inputs):
  none: T_r·d·c_r (block input, saved by the norm) + T_r·4 (its rstd) + T·d·c (the norm's output
        or its sequence-parallel all-gather, saved by the in-projection; a bf16 copy under
        autocast) + T·R·c (the in-projection's output: z and dt slices are kept by the gated
        norm and the scan, so the whole buffer lives) + T·K·c (the convolution's SiLU output:
        the scan's x, B and C) + T·I·c (the scan's output, kept by the gated norm) + T·I·c
        (the gated norm's output, kept by the out-projection) + T·G·4 (its rstd per group).
  full: the block input.
  selective-op: the block input, the two matmul outputs (T·R·c, T·d·c), the scan's output
        (T·I·c), and under sequence parallel the all-gather and reduce-scatter outputs.
Backward scratch of one block: the in-projection output's gradient (T·R·c) and the largest of
  - the gated norm's backward: the incoming gradient, the gradients of y and z, a copy of z
    (4·T·I·c) and eight fp32 intermediates of one slice of at most 2^22 elements;
  - the scan's: the gradients of its output and of z (2·T·I·c), its fp32 workspace (states and
    their gradients 2·b·n_c·H·N·P, scores and theirs 2·b·n_c·G·Q², the d cs partial sums
    2·b·H·L_p·Q/64 + 6·b·H·L_p, dB/dC partial sums 2·S·b·L_p·G·N) and its gradients (dx T·I·c,
    ddt T·H·c, dB and dC 2·T·G·N·(4 + c));
  - the convolution's: z's gradient, dt's, and five T·K·c tensors (its output's gradient, the
    recomputed convolution, the gradient through SiLU, its input's gradient, one product).
"""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.estimate.tracker import allocated_bytes

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
    if mode == "selective-op":
        matmuls = [allocated_bytes(T * m.proj * c), allocated_bytes(T * s.dim * c)]
        comms = allocated_bytes(T * s.dim * c) + allocated_bytes(Tr * s.dim * c) if sp else 0
        return block_input + sum(matmuls[::save_matmul_every]) + allocated_bytes(T * m.inner * c) + comms
    norm_out = allocated_bytes(T * s.dim * (2 if s.autocast else c))
    return (block_input + allocated_bytes(Tr * FP32) + norm_out + allocated_bytes(T * m.proj * c)
            + allocated_bytes(T * m.conv * c) + 2 * allocated_bytes(T * m.inner * c)
            + allocated_bytes(T * m.groups * FP32))


def mamba_backward_scratch(s, m: MambaDims) -> int:
    """Bytes of one Mamba block's backward beyond what it keeps: the largest of its three phases
    (see the module doc)."""
    T, c = s.tokens, s.compute
    chunks = -(-s.seq // m.chunk)
    padded = s.batch * chunks * m.chunk
    group_heads = m.heads // max(m.groups, 1)
    splits = next(k for k in (8, 4, 2, 1) if group_heads % k == 0)
    inner = allocated_bytes(T * m.inner * c)
    # The gated norm's backward: the incoming gradient, its two outputs, a copy of z (a strided
    # slice), and its fp32 intermediates over one slice of rows (mamba_ops._SLICE_ELEMENTS).
    norm = 4 * inner + 8 * allocated_bytes(min(T * m.inner, 1 << 22) * FP32)
    # The scan's: the gradients of y and z, its fp32 workspace and its gradients.
    workspace = (2 * allocated_bytes(s.batch * chunks * m.heads * m.state * m.head_dim * FP32)
                 + 2 * allocated_bytes(s.batch * chunks * m.groups * m.chunk * m.chunk * FP32)
                 + 2 * allocated_bytes(padded * m.heads * max(m.chunk // 64, 1) * FP32)
                 + 6 * allocated_bytes(padded * m.heads * FP32)
                 + 2 * allocated_bytes(splits * padded * m.groups * m.state * FP32))
    scan = 2 * inner + workspace + inner + allocated_bytes(T * m.heads * c) + 2 * allocated_bytes(
        T * m.groups * m.state * (FP32 + c))
    # The convolution's: the gradient of its output (gathered from x, B and C), the recomputed
    # convolution, the gradient through SiLU, its own and one product at a time; z's gradient waits.
    conv = inner + allocated_bytes(T * m.heads * c) + 5 * allocated_bytes(T * m.conv * c)
    return max(norm, scan, conv) + allocated_bytes(T * m.proj * c)
