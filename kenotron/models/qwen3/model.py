"""Qwen3 (dense): Llama's decoder with RMSNorm on each query and key head, no biases, and a
head size that is its own setting (not hidden_size / heads: Qwen3-0.6B has 16 heads of 128 on
a 1024-wide stream)."""

from __future__ import annotations

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.qwen3.args import Qwen3Args


class Qwen3Block(DecoderBlock):
    """RMSNorm -> grouped-query attention with per-head q/k RMSNorm, RMSNorm -> the feed-forward (SwiGLU)."""

    def __init__(self, layer_id: int, args: Qwen3Args) -> None:
        super().__init__(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=GQAttention(
                args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qk_norm_eps=args.norm_eps
            ),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=self.feed_forward_for(args),
        )

    @staticmethod
    def feed_forward_for(args: Qwen3Args) -> nn.Module:
        """The block's feed-forward; Qwen3-MoE's block (a subclass) puts its experts here."""
        return SwiGLU(args.dim, args.ffn_dim)


class Qwen3(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Qwen3Args) -> None:
        super().__init__(args, Qwen3Block, RMSNorm(args.dim, args.norm_eps))
