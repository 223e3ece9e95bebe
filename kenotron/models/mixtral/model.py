"""Mixtral: Mistral's decoder with a mixture-of-experts feed-forward in every block (8 SwiGLU
experts, 2 per token, softmax router with the top-2 weights renormalized)."""

from __future__ import annotations

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.moe import MoE
from kenotron.models.common.norms import RMSNorm
from kenotron.models.mistral.model import MistralBlock
from kenotron.models.mixtral.args import MixtralArgs


class MixtralBlock(MistralBlock):
    """Mistral's block with an MoE feed-forward (the window is the model's mask)."""

    @staticmethod
    def feed_forward_for(args: MixtralArgs) -> MoE:  # type: ignore[override]
        return MoE(args.dim, args.moe)


class Mixtral(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: MixtralArgs) -> None:
        super().__init__(args, MixtralBlock, RMSNorm(args.dim, args.norm_eps), sliding_window=args.sliding_window)
