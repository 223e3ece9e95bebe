"""Mistral 7B: Llama's decoder with sliding-window attention (v0.1: each token sees itself and
the 4095 before it; v0.2/v0.3 dropped the window and moved to rope theta 1e6)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm


@dataclass(frozen=True)
class MistralArgs:
    """Dimensions of a Mistral model (HF names in brackets)."""

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
    vocab_size: int = 32000
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 10000.0
    """RoPE base (rope_theta)."""
    sliding_window: int | None = 4096
    """Keys visible to a query: itself and the sliding_window - 1 before it; None = all (sliding_window)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


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
