"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, head size its own setting) with a
mixture-of-experts feed-forward in every block: softmax router, top-k, renormalized weights,
no shared expert (models/common/moe.py)."""

from __future__ import annotations

from kenotron.models.common.decoder import CausalLM
from kenotron.models.common.moe import MoE
from kenotron.models.common.norms import RMSNorm
from kenotron.models.qwen3.model import Qwen3Block
from kenotron.models.qwen3_moe.args import Qwen3MoEArgs


class Qwen3MoEBlock(Qwen3Block):
    """Qwen3's block (per-head q/k RMSNorm) with an MoE feed-forward."""

    @staticmethod
    def feed_forward_for(args: Qwen3MoEArgs) -> MoE:  # type: ignore[override]
        return MoE(args.dim, args.moe)


class Qwen3MoE(CausalLM):
    """tokens (batch, seq) -> logits (batch, seq, vocab); see CausalLM."""

    def __init__(self, args: Qwen3MoEArgs) -> None:
        super().__init__(args, Qwen3MoEBlock, RMSNorm(args.dim, args.norm_eps))
