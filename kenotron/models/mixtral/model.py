"""Mixtral: Mistral's decoder with a mixture-of-experts feed-forward in every block (8 SwiGLU
experts, 2 per token, softmax router with the top-2 weights renormalized)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.moe import MoE, MoEArgs
from kenotron.models.common.norms import RMSNorm
from kenotron.models.mistral.model import MistralBlock


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


class MixtralBlock(MistralBlock):
    """Mistral's block with an MoE feed-forward (the window is the model's mask)."""

    @staticmethod
    def feed_forward_for(args: MixtralArgs) -> MoE:  # type: ignore[override]
        return MoE(args.dim, args.moe)


class Mixtral(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: MixtralArgs) -> None:
        super().__init__(args, MixtralBlock, RMSNorm(args.dim, args.norm_eps), sliding_window=args.sliding_window)
