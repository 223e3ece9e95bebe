"""Qwen2-MoE: Qwen2's attention (q/k/v biases) with a mixture-of-experts feed-forward in every
block: softmax router, top-k weights as they are (not renormalized), and a shared SwiGLU expert
every token goes through, scaled by a sigmoid gate."""

from __future__ import annotations

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.moe import MoE
from kenotron.models.common.norms import RMSNorm
from kenotron.models.qwen2.model import Qwen2Block
from kenotron.models.qwen2_moe.args import Qwen2MoEArgs


class Qwen2MoEBlock(Qwen2Block):
    """Qwen2's block (q/k/v bias) with an MoE feed-forward and its gated shared expert."""

    @staticmethod
    def feed_forward_for(args: Qwen2MoEArgs) -> MoE:  # type: ignore[override]
        return MoE(args.dim, args.moe)


class Qwen2MoE(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Qwen2MoEArgs) -> None:
        super().__init__(args, Qwen2MoEBlock, RMSNorm(args.dim, args.norm_eps))
