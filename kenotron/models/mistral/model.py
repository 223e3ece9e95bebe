"""Mistral 7B: Llama's decoder with sliding-window attention (v0.1: each token sees itself and
the 4095 before it; v0.2/v0.3 dropped the window and moved to rope theta 1e6)."""

from __future__ import annotations

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm
from kenotron.models.mistral.args import MistralArgs


class MistralBlock(DecoderBlock):
    """RMSNorm -> grouped-query attention, RMSNorm -> the feed-forward (SwiGLU); the window is the model's mask."""

    def __init__(self, layer_id: int, args: MistralArgs) -> None:
        super().__init__(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=GQAttention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=self.feed_forward_for(args),
        )

    @staticmethod
    def feed_forward_for(args: MistralArgs) -> nn.Module:
        """The block's feed-forward; Mixtral's block (a subclass) puts its experts here."""
        return SwiGLU(args.dim, args.ffn_dim)


class Mistral(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: MistralArgs) -> None:
        super().__init__(args, MistralBlock, RMSNorm(args.dim, args.norm_eps), sliding_window=args.sliding_window)
