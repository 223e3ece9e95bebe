"""Qwen3-MoE's dimensions as plain data (no torch): flavors.py names sizes with it, the launcher
checks a config's model shape with it before torch is imported, model.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.moe_args import MoEArgs


@dataclass(frozen=True)
class Qwen3MoEArgs:
    """Dimensions of a Qwen3-MoE model (HF names in brackets)."""

    dim: int = 2048
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 48
    """Transformer blocks, each with an MoE feed-forward (num_hidden_layers)."""
    n_heads: int = 32
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 4
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    head_dim: int = 128
    """Size of each attention head (head_dim)."""
    vocab_size: int = 151936
    """Embedding rows (vocab_size)."""
    moe: MoEArgs = field(default_factory=lambda: MoEArgs(n_experts=128, top_k=8, ffn_dim=768))
    """The MoE feed-forward: experts, top-k, expert width (num_experts, num_experts_per_tok, moe_intermediate_size)."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm, the per-head q/k norms included (rms_norm_eps)."""
    rope_theta: float = 1_000_000.0
    """RoPE base (rope_theta)."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""
