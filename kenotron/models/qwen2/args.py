"""Qwen2's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass


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
