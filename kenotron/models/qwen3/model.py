"""Qwen3 (dense): Llama's decoder with RMSNorm on each query and key head, no biases, and a
head size that is its own setting (not hidden_size / heads: Qwen3-0.6B has 16 heads of 128 on
a 1024-wide stream)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.norms import RMSNorm


@dataclass(frozen=True)
class Qwen3Args:
    """Dimensions of a Qwen3 dense model (HF names in brackets)."""

    dim: int = 4096
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 36
    """Transformer blocks (num_hidden_layers)."""
    n_heads: int = 32
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 8
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    head_dim: int = 128
    """Size of each attention head (head_dim); n_heads * head_dim need not equal dim."""
    ffn_dim: int = 12288
    """Hidden width of the SwiGLU MLP (intermediate_size)."""
    vocab_size: int = 151936
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm, the per-head q/k norms included (rms_norm_eps)."""
    rope_theta: float = 1_000_000.0
    """RoPE base (rope_theta)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""


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
