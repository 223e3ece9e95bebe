"""Grouped-query self-attention over `scaled_dot_product_attention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kenotron.models.common.init import ZEROS, InitSpec, trunc_normal
from kenotron.models.common.rope import apply_rope


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on (batch, heads, seq, head_dim); k/v may have fewer (grouped) heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class GQAttention(nn.Module):
    """Multi-head attention with n_kv_heads <= n_heads shared key/value heads and RoPE.

    Head counts are read from the projection outputs (`view(..., -1, head_dim)`), so the
    same code runs on tensor-parallel shards that hold n_heads / tp heads.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out.transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.wo(out)

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        """q/k/v at init_std (biases zero); the output projection at out_std (depth-scaled)."""
        specs: dict[str, InitSpec] = {}
        for name in ("wq", "wk", "wv"):
            specs[f"{name}.weight"] = trunc_normal(init_std)
            if getattr(self, name).bias is not None:
                specs[f"{name}.bias"] = ZEROS
        specs["wo.weight"] = trunc_normal(out_std)
        return specs
