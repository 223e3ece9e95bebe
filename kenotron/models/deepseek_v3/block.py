"""DeepSeek-V3's block (its args: args.py). Block i holds `attention` (models/common/latent_attention.py) and either `mlp` (a dense SwiGLU,
blocks below `n_dense_layers`) or `feed_forward` (the MoE layer, models/common/moe.py): the MoE
layers keep the name every MoE family's plans use, the dense ones get their own.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.init import InitSpec, prefixed
from kenotron.models.common.latent_attention import LatentAttention, LatentShape
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.moe import MoE
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import softmax_scale_factor
from kenotron.models.deepseek_v3.args import DeepSeekV3Args


def latent_shape(args: DeepSeekV3Args) -> LatentShape:
    """The MLA layer's sizes of a block of `args`."""
    return LatentShape(args.n_heads, args.q_rank, args.kv_rank, args.nope_dim, args.rope_dim, args.v_dim, args.norm_eps)


class DeepSeekV3Block(nn.Module):
    """x + attention(attention_norm(x)), then h + mlp-or-moe(ffn_norm(h)); see the module docstring."""

    def __init__(self, layer_id: int, args: DeepSeekV3Args, *, moe: bool | None = None) -> None:
        """`moe`: whether the block has experts (None: as its position says)."""
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = LatentAttention(args.dim, latent_shape(args), softmax_scale_factor(args.rope_scaling))
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        if moe if moe is not None else layer_id >= args.n_dense_layers:
            self.feed_forward = MoE(args.dim, args.moe)
        else:
            self.mlp = SwiGLU(args.dim, args.ffn_dim)
        self.out_std = 0.02 / math.sqrt(2 * (layer_id + 1))

    @property
    def ffn(self) -> nn.Module:
        return self.feed_forward if hasattr(self, "feed_forward") else self.mlp

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
        kv_cache=None, block_mask: BlockMask | None = None,
    ) -> torch.Tensor:
        # (x, cos, sin) positional, the rest by keyword (see DecoderBlock.forward).
        if block_mask is not None:
            h = x + self.attention(self.attention_norm(x), cos, sin, block_mask=block_mask)
        elif attn_mask is None and kv_cache is None:
            h = x + self.attention(self.attention_norm(x), cos, sin)
        else:
            h = x + self.attention(self.attention_norm(x), cos, sin, attn_mask=attn_mask, kv_cache=kv_cache)
        return h + self.ffn(self.ffn_norm(h))

    def param_init_specs(self) -> dict[str, InitSpec]:
        name = "feed_forward" if hasattr(self, "feed_forward") else "mlp"
        return {
            **prefixed("attention_norm", self.attention_norm.param_init_specs()),
            **prefixed("ffn_norm", self.ffn_norm.param_init_specs()),
            **prefixed("attention", self.attention.param_init_specs(0.02, self.out_std)),
            **prefixed(name, self.ffn.param_init_specs(0.02, self.out_std)),
        }
