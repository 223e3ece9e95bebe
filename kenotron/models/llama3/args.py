"""Llama 3's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.rope_scaling import RopeScaling


@dataclass(frozen=True)
class Llama3Args:
    """Dimensions of a Llama 3 model (names follow the paper; HF names in comments)."""

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
    vocab_size: int = 128256
    """Embedding rows."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 500000.0
    """RoPE base."""
    rope_scaling: RopeScaling | None = field(default_factory=RopeScaling)
    """Llama 3.1 frequency scaling; None for plain RoPE."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (Llama 3.2 1B/3B)."""
    max_seq_len: int = 8192
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads
