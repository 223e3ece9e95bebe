"""Qwen2 and Qwen2.5 (dense): Llama's decoder with biases on the q/k/v projections.

Same blocks as Llama 3 otherwise (RMSNorm, RoPE, grouped-query attention, SwiGLU); the
small sizes tie the embedding to the output projection. Qwen2's optional sliding window
(`use_sliding_window`) is off in every published checkpoint and not implemented here.
"""

from __future__ import annotations

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.qwen2.args import Qwen2Args


class Qwen2Block(DecoderBlock):
    """RMSNorm -> grouped-query attention with q/k/v bias, RMSNorm -> the feed-forward (SwiGLU)."""

    def __init__(self, layer_id: int, args: Qwen2Args) -> None:
        super().__init__(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=GQAttention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim, bias=True),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=self.feed_forward_for(args),
        )

    @staticmethod
    def feed_forward_for(args: Qwen2Args) -> nn.Module:
        """The block's feed-forward; Qwen2-MoE's block (a subclass) puts its experts here."""
        return SwiGLU(args.dim, args.ffn_dim)


class Qwen2(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Qwen2Args) -> None:
        super().__init__(args, Qwen2Block, RMSNorm(args.dim, args.norm_eps))
