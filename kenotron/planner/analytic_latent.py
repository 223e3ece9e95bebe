"""Multi-head latent attention (deepseek_v3's MLA, models/common/latent_attention.py) in the
closed-form memory model (analytic.py), in its notation plus: r_q the query's rank (0: a full-rank
wq), r_kv the latent's rank, q = nope + rope the query/key width of a head, v its value width,
H_t = H / t the rank's heads. The latent path (wq_a, q_norm, wkv_a, kv_norm) is replicated under
tensor parallel, so its terms keep every token of the (gathered) sequence. Bytes one block's
attention keeps for backward:

  none          2·T·r_q·c + T·4 (q_norm's input and rsqrt, its output saved by wq_b; with r_q > 0)
                + T·(r_kv + rope)·c + T·4 (kv_norm's input: all of wkv_a's output, of which the
                  latent is a view) + T·r_kv·c (kv_norm's output, saved by wkv_b)
                + 4·T·H_t·q·c (the attention's q, k, v zero-padded to q wide, and its padded
                  output) + b·H_t·s·4 (log-sum-exp)
                + T·H_t·v·c (the output projection's input: the padded output cut to v and made
                  contiguous, a copy whatever the kernel's layout, so no context-parallel copy on top)
                + 2·s·rope·c (the RoPE tables cast to c, when c is not fp32)
  selective-op  the matmul outputs kept by the policy (wq_a, wq_b or wq, wkv_a, wkv_b, wo in that
                order, then the MLP's), the attention's padded output and log-sum-exp
  full          nothing here: the block keeps its input only (analytic.py)

With the values unpadded (`narrow_values`: cuDNN's SDPA or FlexAttention takes them as they are) the
attention's 4·T·H_t·q·c + T·H_t·v·c become 2·T·H_t·q·c (q and k) + T·H_t·(nope + v)·c (v is a view
of wkv_b's output, whose storage it keeps whole) + T·H_t·v·c (the output, laid out as q is, so the
output projection's input is a view of it, not a copy); under selective-op the output is v wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kenotron.estimate.breakdown import allocated_bytes

FP32 = 4


@dataclass(frozen=True)
class LatentDims:
    """One MLA layer's sizes (the heads are the StepShape's)."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    narrow_values: bool = False
    """The attention takes the values at their own width (Choices.narrow_values), not padded."""

    @classmethod
    def of(cls, args: Any, narrow_values: bool = False) -> LatentDims | None:
        """The MLA sizes of a model's args, None for other attention."""
        if not hasattr(args, "kv_rank"):
            return None
        return cls(args.q_rank, args.kv_rank, args.nope_dim, args.rope_dim, args.v_dim, narrow_values)

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim


def latent_matmul_widths(m: LatentDims, heads: int) -> list[int]:
    """Output widths of the attention's matmuls in forward order (`heads` on this rank)."""
    query = [m.q_rank, heads * m.qk_dim] if m.q_rank else [heads * m.qk_dim]
    return query + [m.kv_rank + m.rope_dim, heads * (m.nope_dim + m.v_dim), heads * m.v_dim]


def latent_attention_activations(m: LatentDims, s: Any, mode: str) -> int:
    """Bytes the attention of one block keeps under `mode` "none" (see the module docstring); for
    selective-op, only the attention's own output (the matmul outputs are counted with the MLP's)."""
    T, c, heads = s.tokens, s.compute, s.heads // s.tp
    query_wide = allocated_bytes(T * heads * m.qk_dim * c)
    value_wide = allocated_bytes(T * heads * m.v_dim * c)
    lse = allocated_bytes(s.batch * heads * s.seq * FP32)
    if mode == "selective-op":
        return (value_wide if m.narrow_values else query_wide) + lse
    query = 2 * allocated_bytes(T * m.q_rank * c) + allocated_bytes(T * FP32) if m.q_rank else 0
    latent = (allocated_bytes(T * (m.kv_rank + m.rope_dim) * c) + allocated_bytes(T * FP32)
              + allocated_bytes(T * m.kv_rank * c))
    if m.narrow_values:
        attention = 2 * query_wide + allocated_bytes(T * heads * (m.nope_dim + m.v_dim) * c) + value_wide + lse
    else:
        attention = 4 * query_wide + lse + value_wide
    rope_tables = 2 * allocated_bytes(s.seq * m.rope_dim * c) if c != FP32 else 0
    return query + latent + attention + rope_tables
