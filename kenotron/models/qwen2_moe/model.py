"""Qwen2-MoE: Qwen2's attention (q/k/v biases) with a mixture-of-experts feed-forward in every
block: softmax router, top-k weights as they are (not renormalized), and a shared SwiGLU expert
every token goes through, scaled by a sigmoid gate."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.moe import MoE, MoEArgs
from kenotron.models.common.norms import RMSNorm
from kenotron.models.qwen2.model import Qwen2Block


@dataclass(frozen=True)
class Qwen2MoEArgs:
    """Dimensions of a Qwen2-MoE model (HF names in brackets)."""

    dim: int = 3584
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 28
    """Transformer blocks, each with an MoE feed-forward (num_hidden_layers)."""
    n_heads: int = 28
    """Query heads (num_attention_heads)."""
    n_kv_heads: int = 4
    """Key/value heads shared by groups of query heads (num_key_value_heads)."""
    vocab_size: int = 151936
    """Embedding rows (vocab_size)."""
    moe: MoEArgs = field(default_factory=lambda: MoEArgs(
        n_experts=64, top_k=8, ffn_dim=2560, norm_topk=False, shared_ffn_dim=20480, shared_gate=True))
    """The MoE feed-forward (num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
    shared_expert_intermediate_size; the shared expert is always gated)."""
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


class Qwen2MoEBlock(Qwen2Block):
    """Qwen2's block (q/k/v bias) with an MoE feed-forward and its gated shared expert."""

    @staticmethod
    def feed_forward_for(args: Qwen2MoEArgs) -> MoE:  # type: ignore[override]
        return MoE(args.dim, args.moe)


class Qwen2MoE(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Qwen2MoEArgs) -> None:
        super().__init__(args, Qwen2MoEBlock, RMSNorm(args.dim, args.norm_eps))
