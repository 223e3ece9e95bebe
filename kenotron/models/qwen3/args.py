"""Qwen3's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass


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
