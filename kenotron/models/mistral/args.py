"""Mistral's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass


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
