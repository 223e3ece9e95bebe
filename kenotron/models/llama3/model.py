"""Llama 3 (3, 3.1, 3.2): pre-norm decoder with RMSNorm, RoPE, grouped-query attention, SwiGLU.

A plain nn.Module: nothing here knows about parallelism. Build it on the meta device, then
`to_empty(device=...)` and `init_weights()`; the RoPE tables are buffers recomputed by
`init_weights` so they are right after materialization. The decoder itself (forward, tied
embeddings, init, KV cache) is common/decoder.py's `CausalLM`, shared with the other families.
"""

from __future__ import annotations

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.llama3.args import Llama3Args


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
