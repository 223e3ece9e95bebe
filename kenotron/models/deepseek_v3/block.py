"""DeepSeek-V3's block (its args: args.py): the common pre-norm DecoderBlock with multi-head latent
attention (models/common/latent_attention.py) and either a dense SwiGLU named `mlp` (blocks below
`n_dense_layers`) or the MoE layer named `feed_forward` (models/common/moe.py): the MoE layers keep
the name every MoE family's plans use, the dense ones get their own (HF's names follow the same split).
"""

from __future__ import annotations

from kenotron.models.common.decoder import DecoderBlock
from kenotron.models.common.latent_attention import LatentAttention, LatentShape
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.moe import MoE
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import softmax_scale_factor
from kenotron.models.deepseek_v3.args import DeepSeekV3Args


def latent_shape(args: DeepSeekV3Args) -> LatentShape:
    """The MLA layer's sizes of a block of `args`."""
    return LatentShape(args.n_heads, args.q_rank, args.kv_rank, args.nope_dim, args.rope_dim, args.v_dim, args.norm_eps)


class DeepSeekV3Block(DecoderBlock):
    """x + attention(attention_norm(x)), then h + mlp-or-moe(ffn_norm(h)); see the module docstring."""

    def __init__(self, layer_id: int, args: DeepSeekV3Args, *, moe: bool | None = None) -> None:
        """`moe`: whether the block has experts (None: as its position says)."""
        experts = moe if moe is not None else layer_id >= args.n_dense_layers
        super().__init__(
            layer_id,
            attention_norm=RMSNorm(args.dim, args.norm_eps),
            attention=LatentAttention(args.dim, latent_shape(args), softmax_scale_factor(args.rope_scaling)),
            ffn_norm=RMSNorm(args.dim, args.norm_eps),
            feed_forward=MoE(args.dim, args.moe) if experts else SwiGLU(args.dim, args.ffn_dim),
            ffn_name="feed_forward" if experts else "mlp",
        )
