"""StarCoder2: a pre-norm decoder with LayerNorm (with bias), biases on every attention and MLP
projection, a GELU(tanh) MLP without gate, RoPE, grouped-query attention and a 4096-token
sliding window.

Parameter names follow Llama's; the MLP is `feed_forward.{w1, w2}` (HF's c_fc, c_proj: no
w3), and the norms and projections carry a `.bias` next to their `.weight`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.models.common.attention import GQAttention
from kenotron.models.common.decoder import CausalLM, DecoderBlock
from kenotron.models.common.mlp import GeluMLP
from kenotron.models.common.norms import LayerNorm


@dataclass(frozen=True)
class StarCoder2Args:
    """Dimensions of a StarCoder2 model (HF names in brackets)."""

    dim: int = 3072
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 30
    """Transformer blocks (num_hidden_layers)."""
    n_heads: int = 24
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 2
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    ffn_dim: int = 12288
    """Hidden width of the GELU MLP (intermediate_size)."""
    vocab_size: int = 49152
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon (norm_epsilon)."""
    rope_theta: float = 999999.4420358813
    """RoPE base (rope_theta; the 3B's published value is this odd float)."""
    sliding_window: int | None = 4096
    """Keys visible to a query: itself and the sliding_window - 1 before it; None = all (sliding_window)."""
    bias: bool = True
    """Biases on the attention and MLP projections (use_bias)."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class StarCoder2Block(DecoderBlock):
    """LayerNorm -> grouped-query attention (all projections biased), LayerNorm -> GELU MLP."""

    def __init__(self, layer_id: int, args: StarCoder2Args) -> None:
        super().__init__(
            layer_id,
            attention_norm=LayerNorm(args.dim, args.norm_eps),
            attention=GQAttention(
                args.dim, args.n_heads, args.n_kv_heads, args.head_dim, bias=args.bias, out_bias=args.bias
            ),
            ffn_norm=LayerNorm(args.dim, args.norm_eps),
            feed_forward=GeluMLP(args.dim, args.ffn_dim, bias=args.bias),
        )


class StarCoder2(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: StarCoder2Args) -> None:
        super().__init__(
            args, StarCoder2Block, LayerNorm(args.dim, args.norm_eps), sliding_window=args.sliding_window
        )
