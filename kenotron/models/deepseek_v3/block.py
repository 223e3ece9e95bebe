"""DeepSeek-V3's args and block. Block i holds `attention` (models/common/latent_attention.py) and either `mlp` (a dense SwiGLU,
blocks below `n_dense_layers`) or `feed_forward` (the MoE layer, models/common/moe.py): the MoE
layers keep the name every MoE family's plans use, the dense ones get their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.init import InitSpec, prefixed
from kenotron.models.common.latent_attention import LatentAttention, LatentShape
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.moe import MoE, MoEArgs
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import YarnScaling, softmax_scale_factor


def _v3_moe() -> MoEArgs:
    return MoEArgs(n_experts=256, top_k=8, ffn_dim=2048, score_func="sigmoid", norm_topk=True, route_scale=2.5,
                   shared_ffn_dim=2048, n_groups=8, topk_groups=4)


@dataclass(frozen=True)
class DeepSeekV3Args:
    """Dimensions of a DeepSeek-V3-class model (HF names in brackets)."""

    dim: int = 7168
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 61
    """Transformer blocks (num_hidden_layers), the dense ones included."""
    n_heads: int = 128
    """Attention heads (num_attention_heads)."""
    q_rank: int = 1536
    """Rank of the query's low-rank projection (q_lora_rank); 0: a full-rank query projection."""
    kv_rank: int = 512
    """Rank of the key/value latent (kv_lora_rank), what the generation cache holds per token."""
    nope_dim: int = 128
    """Per-head query/key size without RoPE (qk_nope_head_dim)."""
    rope_dim: int = 64
    """Per-head query/key size with RoPE (qk_rope_head_dim); the key's part is shared by the heads."""
    v_dim: int = 128
    """Per-head value size (v_head_dim)."""
    ffn_dim: int = 18432
    """Hidden width of the dense blocks' SwiGLU (intermediate_size)."""
    n_dense_layers: int = 3
    """Leading blocks with a dense SwiGLU instead of experts (first_k_dense_replace)."""
    moe: MoEArgs = field(default_factory=_v3_moe)
    """The MoE blocks' experts and routing (n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    routed_scaling_factor, n_group, topk_group; shared_ffn_dim = n_shared_experts x moe_intermediate_size)."""
    vocab_size: int = 129280
    """Embedding rows (vocab_size)."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm, the latent norms included (rms_norm_eps)."""
    rope_theta: float = 10000.0
    """RoPE base (rope_theta)."""
    rope_scaling: YarnScaling | None = None
    """YaRN scaling of the RoPE frequencies and of the softmax (rope_scaling with type yarn); None: plain."""
    rope_interleave: bool = True
    """Whether the HF checkpoint's RoPE rows are interleaved pairs (rope_interleave); kenotron
    computes in halves either way and reorders those rows on conversion."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection (tie_word_embeddings)."""
    max_seq_len: int = 4096
    """Length of the RoPE tables; the trainer sets it to training.seq_len."""
    mtp_depth: int = 0
    """Multi-token-prediction modules (num_nextn_predict_layers): module k predicts token t+k+1; 0: off."""
    mtp_loss_weight: float = 0.3
    """λ of the MTP loss: the step's loss adds λ / mtp_depth x the modules' summed mean losses (kenotron's; not in config.json)."""

    @property
    def head_dim(self) -> int:
        """The RoPE tables' width: the rotated part of each head."""
        return self.rope_dim

    @property
    def n_kv_heads(self) -> int:
        """Every head has its own keys and values (expanded from the shared latent)."""
        return self.n_heads

    @property
    def latent_shape(self) -> LatentShape:
        return LatentShape(self.n_heads, self.q_rank, self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim,
                           self.norm_eps)


class DeepSeekV3Block(nn.Module):
    """x + attention(attention_norm(x)), then h + mlp-or-moe(ffn_norm(h)); see the module docstring."""

    def __init__(self, layer_id: int, args: DeepSeekV3Args, *, moe: bool | None = None) -> None:
        """`moe`: whether the block has experts (None: as its position says)."""
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = LatentAttention(args.dim, args.latent_shape, softmax_scale_factor(args.rope_scaling))
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
