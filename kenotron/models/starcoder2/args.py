"""StarCoder2's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass


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
