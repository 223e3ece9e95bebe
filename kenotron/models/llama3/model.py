"""Llama 3 (3, 3.1, 3.2): pre-norm decoder with RMSNorm, RoPE, grouped-query attention, SwiGLU.

A plain nn.Module: nothing here knows about parallelism. Build it on the meta device, then
`to_empty(device=...)` and `init_weights()`; the RoPE tables are buffers recomputed by
`init_weights` so they are right after materialization. The decoder itself (forward, tied
embeddings, init, KV cache) is common/decoder.py's `CausalLM`, shared with the other families.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import RopeScaling


@dataclass(frozen=True)
class Llama3Args:
    """Dimensions of a Llama 3 model (names follow the paper; HF names in comments)."""

    dim: int = 4096
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 32
    """Transformer blocks (num_hidden_layers)."""
    n_heads: int = 32
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 8
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    ffn_dim: int = 14336
    """Hidden width of the SwiGLU MLP (intermediate_size)."""
    vocab_size: int = 128256
    """Embedding rows."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 500000.0
    """RoPE base."""
    rope_scaling: RopeScaling | None = field(default_factory=RopeScaling)
    """Llama 3.1 frequency scaling; None for plain RoPE."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (Llama 3.2 1B/3B)."""
    max_seq_len: int = 8192
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class TransformerBlock(DecoderBlock):
    """RMSNorm -> grouped-query attention, RMSNorm -> SwiGLU."""

    def __init__(self, layer_id: int, args: Llama3Args) -> None:
        super().__init__(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=GQAttention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=SwiGLU(args.dim, args.ffn_dim),
        )


class Llama3(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Llama3Args) -> None:
        super().__init__(args, TransformerBlock, RMSNorm(args.dim, args.norm_eps), rope_scaling=args.rope_scaling)
