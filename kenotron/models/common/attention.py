"""Grouped-query self-attention over `scaled_dot_product_attention`, with the options the model
families need: q/k/v and output biases (Qwen2, StarCoder2), per-head q/k RMSNorm (Qwen3),
sliding windows (Mistral, StarCoder2, through an explicit mask) and a KV cache (generation).

The training path without a window stays on SDPA's `is_causal=True` (no mask tensor), which
the fused flash / cuDNN kernels take. That path goes through the module's `attention_fn`
(`causal_attention` by default), which others may replace: context parallel puts a module
there that attends over a sequence sharded across ranks, and the trainer's `flash_attn`
backend a `FlashAttention` (flash_attention.py). The model never does.

With a FlexAttention `block_mask` (flex_attention.py: causal, windowed or block-causal over
the documents of a packed window, built once per batch) the layer runs flex_attention instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.flash_attention import FlashAttention
from kenotron.models.common.flex_attention import flex_attend
from kenotron.models.common.init import ONES, ZEROS, InitSpec, trunc_normal
from kenotron.models.common.kv_cache import LayerKVCache
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import apply_rope


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on (batch, heads, seq, head_dim); k/v may have fewer (grouped) heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def sees_whole_sequence(attention_fn: Callable[..., torch.Tensor]) -> bool:
    """Whether an attention_fn works on this rank's whole sequence (SDPA, flash-attn), so the
    layer may bypass it for a mask or a KV cache; context parallel's, which sees a shard, may not."""
    return attention_fn is causal_attention or isinstance(attention_fn, FlashAttention)


def takes_documents(attention_fn: Callable[..., torch.Tensor]) -> bool:
    """Whether an attention_fn applies a document mask itself: context parallel's attention, given
    the batch's document ids (kenotron.parallel.context.documents.SequenceDocuments) in place of
    a BlockMask, which it could not use on a shard of the sequence."""
    return bool(getattr(attention_fn, "takes_documents", False))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA on (batch, heads, seq, head_dim). `attn_mask` (bool, True = may attend) or None:
    None means causal over equal-length q and k, or a single query that sees every key."""
    if attn_mask is None:
        if q.shape[2] == 1:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
        if q.shape[2] != k.shape[2]:
            raise ValueError(
                f"{q.shape[2]} queries against {k.shape[2]} keys need an explicit attention mask "
                f"(see build_attention_mask)"
            )
        return causal_attention(q, k, v)
    if q.is_cuda and k.shape[1] != q.shape[1]:
        # CUDA's kernels that take an arbitrary mask have no grouped-query path; SDPA would
        # fall back to the unfused math kernel, so repeat the k/v heads here instead.
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=k.shape[1] != q.shape[1])


def build_attention_mask(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    sliding_window: int | None = None,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask (batch or 1, 1, queries, keys): key at position p is visible from a query
    at position q when p <= q, q - p < sliding_window (HF's convention: the window counts the
    query itself) and the key is a real token (`key_valid` (batch, keys)). A padding query
    still sees itself, so no row is empty (an empty row would give NaN that spreads)."""
    q = q_positions[:, None]
    k = k_positions[None, :]
    allowed = k <= q
    if sliding_window is not None:
        allowed = allowed & (q - k < sliding_window)
    allowed = allowed[None, None]
    if key_valid is not None:
        allowed = allowed & (key_valid[:, None, None, :] | (k == q)[None, None])
    return allowed


class GQAttention(nn.Module):
    """Multi-head attention with n_kv_heads <= n_heads shared key/value heads and RoPE.

    Head counts are read from the projection outputs (`view(..., -1, head_dim)`), so the
    same code runs on tensor-parallel shards that hold n_heads / tp heads.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        *,
        out_bias: bool = False,
        qk_norm_eps: float | None = None,
    ) -> None:
        """`bias`: biases on q/k/v; `out_bias`: on the output projection; `qk_norm_eps`: when
        set, RMSNorm each query and key head (over head_dim) before RoPE, as Qwen3 does."""
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=out_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        # Causal attention (q, k, v) -> out of the training path (no mask, no cache).
        self.attention_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_attention
        # RoPE on (batch, seq, heads, head_dim); a fused kernel may replace it (models/common/eager_kernels.py).
        self.rope_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rope

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        kv_cache: LayerKVCache | None = None,
        block_mask: BlockMask | None = None,
    ) -> torch.Tensor:
        """x (batch, seq, dim) -> (batch, seq, dim). `attn_mask`: see `attend`; `kv_cache`:
        this layer's cache, which this call's keys/values are appended to and read from;
        `block_mask`: attend through FlexAttention under this mask (training, no cache)."""
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rope_fn(q, cos, sin).transpose(1, 2)
        k = self.rope_fn(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if attn_mask is None and kv_cache is None and block_mask is None:
            out = self.attention_fn(q, k, v)
        elif attn_mask is None and kv_cache is None and takes_documents(self.attention_fn):
            out = self.attention_fn(q, k, v, block_mask)
        else:
            if not sees_whole_sequence(self.attention_fn):
                # A replaced attention_fn (context parallel) sees only part of the sequence.
                raise RuntimeError(
                    f"this attention's attention_fn was replaced by {type(self.attention_fn).__name__}, which "
                    f"supports plain causal attention only; an attention mask, a block mask or a KV cache "
                    f"needs the default"
                )
            if block_mask is not None:
                if attn_mask is not None or kv_cache is not None:
                    raise ValueError("block_mask replaces attn_mask and does not combine with a KV cache")
                out = flex_attend(q, k, v, block_mask)
            else:
                if kv_cache is not None:
                    k, v = kv_cache.update(k, v)
                out = attend(q, k, v, attn_mask)
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
        if self.wo.bias is not None:
            specs["wo.bias"] = ZEROS
        if self.q_norm is not None:
            specs["q_norm.weight"] = ONES
            specs["k_norm.weight"] = ONES
        return specs
