"""Qwen2 and Qwen2.5 (dense): Llama's decoder with biases on the q/k/v projections.

Same blocks as Llama 3 otherwise (RMSNorm, RoPE, grouped-query attention, SwiGLU); the
small sizes tie the embedding to the output projection. Qwen2's optional sliding window
(`use_sliding_window`) is off in every published checkpoint and not implemented here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm


@dataclass(frozen=True)
class Qwen2Args:
    """Dimensions of a Qwen2 / Qwen2.5 model (HF names in brackets)."""

    dim: int = 3584
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 28
    """Transformer blocks (num_hidden_layers)."""
    n_heads: int = 28
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 4
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    ffn_dim: int = 18944
    """Hidden width of the SwiGLU MLP (intermediate_size)."""
    vocab_size: int = 152064
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 1_000_000.0
    """RoPE base (rope_theta)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


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
