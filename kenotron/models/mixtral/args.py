"""Mixtral's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.moe_args import MoEArgs


@dataclass(frozen=True)
class MixtralArgs:
    """Dimensions of a Mixtral model (HF names in brackets)."""

    dim: int = 4096
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 32
    """Transformer blocks, each with an MoE feed-forward (num_hidden_layers)."""
    n_heads: int = 32
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 8
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    vocab_size: int = 32000
    """Embedding rows (vocab_size)."""
    moe: MoEArgs = field(default_factory=lambda: MoEArgs(n_experts=8, top_k=2, ffn_dim=14336))
    """The MoE feed-forward (num_local_experts, num_experts_per_tok, intermediate_size)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (rms_norm_eps)."""
    rope_theta: float = 1_000_000.0
    """RoPE base (rope_theta)."""
    sliding_window: int | None = None
    """Keys visible to a query: itself and the sliding_window - 1 before it; None = all (sliding_window)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads
