"""Multi-head latent attention (MLA, DeepSeek-V2/V3): keys and values from one low-rank latent.

    q      = wq_b(q_norm(wq_a(x)))               (or wq(x) without the query's low rank)
             -> per head [q_nope | q_rope], RoPE on q_rope
    [c | k_rope] = wkv_a(x)                      c: the latent (kv_rank), k_rope: one RoPE key
    c      = kv_norm(c)                          shared by every head
    [k_nope | v] = wkv_b(c) per head
    k      = [k_nope | k_rope]                   the same k_rope for every head
    out    = wo(attention(q, k, v))

Generation caches the latent c and k_rope (kv_rank + rope_dim numbers a token, not the heads'
keys and values: `LatentCache`), and expands them through wkv_b at every step.

The RoPE part uses the "rotate half" layout like every family here; checkpoints that rotate
interleaved pairs (DeepSeek's `rope_interleave`) have those rows reordered on conversion
(`deinterleave_rows`). Under YaRN the softmax temperature is scaled too: q is multiplied by
`softmax_scale_factor`, so the attention itself keeps SDPA's 1/sqrt(head_dim) and any
`attention_fn` (context parallel's, flash-attn) serves unchanged; the values, narrower than the
keys, are zero-padded to the keys' width where a kernel needs one head size. cuDNN's SDPA and
FlexAttention's CUDA kernel take both widths: where the kernel choice says one of them runs
(`narrow_value_attention`, set by kernel_choice/attention_backend.py's use_narrow_values), the
values go to it unpadded.

Tensor parallel splits the heads (wq or wq_b, wkv_b colwise, wo rowwise); the latent path (wq_a,
q_norm, wkv_a, kv_norm) is replicated. The latent's gradient comes back whole through the
colwise wkv_b and wq_b, but k_rope's comes from this rank's heads only: `rope_key_grad` (identity
here) is where tensor parallel sums it over the ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.models.common.attention import attend, causal_attention, sees_whole_sequence, takes_documents
from kenotron.models.common.flex_attention import flex_attend
from kenotron.models.common.init import ONES, InitSpec, trunc_normal
from kenotron.models.common.kv_cache import KVCache
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.rope import apply_rope


@dataclass(frozen=True)
class LatentShape:
    """The sizes of an MLA layer (HF names in brackets)."""

    n_heads: int
    """Attention heads (num_attention_heads)."""
    q_rank: int
    """Rank of the query's low-rank projection (q_lora_rank); 0: a full-rank wq."""
    kv_rank: int
    """Rank of the key/value latent (kv_lora_rank)."""
    nope_dim: int
    """Per-head query/key size without RoPE (qk_nope_head_dim)."""
    rope_dim: int
    """Per-head query/key size with RoPE, the key's shared by every head (qk_rope_head_dim)."""
    v_dim: int
    """Per-head value size (v_head_dim)."""
    norm_eps: float = 1e-6
    """Epsilon of the latent norms (rms_norm_eps)."""

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class LatentAttention(nn.Module):
    """x (batch, seq, dim) -> (batch, seq, dim); see the module docstring. Head counts are read from
    the projections' outputs, so the code runs on tensor-parallel shards too."""

    def __init__(self, dim: int, shape: LatentShape, softmax_scale_factor: float = 1.0) -> None:
        super().__init__()
        self.shape = shape
        s = shape
        if s.q_rank:
            self.wq_a = nn.Linear(dim, s.q_rank, bias=False)
            self.q_norm = RMSNorm(s.q_rank, s.norm_eps)
            self.wq_b = nn.Linear(s.q_rank, s.n_heads * s.qk_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, s.n_heads * s.qk_dim, bias=False)
        self.wkv_a = nn.Linear(dim, s.kv_rank + s.rope_dim, bias=False)
        self.kv_norm = RMSNorm(s.kv_rank, s.norm_eps)
        self.wkv_b = nn.Linear(s.kv_rank, s.n_heads * (s.nope_dim + s.v_dim), bias=False)
        self.wo = nn.Linear(s.n_heads * s.v_dim, dim, bias=False)
        self.q_scale = softmax_scale_factor
        # Causal attention (q, k, v) -> out of the training path; context parallel may replace it.
        self.attention_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_attention
        self.rope_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rope
        self.rope_key_grad: Callable[[torch.Tensor], torch.Tensor] = _identity
        # Causal attention taking values narrower than the keys, used in place of the padded values
        # while attention_fn is SDPA's (and set, FlexAttention gets them unpadded too); None pads them.
        self.narrow_value_attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """(batch, heads, seq, qk_dim): [q_nope | rotated q_rope], times YaRN's softmax factor."""
        bsz, seqlen, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.shape.q_rank else self.wq(x)
        q = q.view(bsz, seqlen, -1, self.shape.qk_dim)
        q_nope, q_rope = q.split([self.shape.nope_dim, self.shape.rope_dim], dim=-1)
        q = torch.cat([q_nope, self.rope_fn(q_rope, cos, sin)], dim=-1)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q.transpose(1, 2)

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normalized latent (batch, seq, kv_rank), the rotated RoPE key (batch, seq, rope_dim))."""
        bsz, seqlen, _ = x.shape
        c, k_rope = self.wkv_a(x).split([self.shape.kv_rank, self.shape.rope_dim], dim=-1)
        k_rope = self.rope_fn(self.rope_key_grad(k_rope).view(bsz, seqlen, 1, -1), cos, sin)
        return self.kv_norm(c), k_rope.view(bsz, seqlen, -1)

    def keys_values(self, c: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's keys (batch, heads, len, qk_dim) and values (batch, heads, len, v_dim)."""
        bsz, length, _ = c.shape
        kv = self.wkv_b(c).view(bsz, length, -1, self.shape.nope_dim + self.shape.v_dim)
        k_nope, v = kv.split([self.shape.nope_dim, self.shape.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope[:, :, None, :].expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        kv_cache: LayerLatentCache | None = None,
        block_mask: BlockMask | None = None,
    ) -> torch.Tensor:
        """As GQAttention.forward; `kv_cache` holds this layer's latents."""
        bsz, seqlen, _ = x.shape
        q = self.queries(x, cos, sin)
        c, k_rope = self.latent(x, cos, sin)
        if kv_cache is not None:
            c, k_rope = kv_cache.update(c, k_rope)
        k, v = self.keys_values(c, k_rope)
        if attn_mask is None and kv_cache is None and (block_mask is None or takes_documents(self.attention_fn)):
            out = self._attention_fn_any_v(q, k, v, block_mask)
        elif not sees_whole_sequence(self.attention_fn):
            raise RuntimeError(
                f"this attention's attention_fn was replaced by {type(self.attention_fn).__name__}, which supports "
                f"plain causal attention only; an attention mask, a block mask or a KV cache needs the default"
            )
        elif block_mask is not None:  # FlexAttention's CUDA kernel takes values narrower than the keys
            narrow = self.narrow_value_attention is not None
            out = flex_attend(q, k, v if narrow else _pad_last(v, q.shape[-1]), block_mask)[..., : v.shape[-1]]
        else:
            out = attend(q, k, v, attn_mask)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))

    def _attention_fn_any_v(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Any = None) -> torch.Tensor:
        """The attention_fn, given values as wide as the keys: flash-attn and the ring kernels take one
        head size, and so do SDPA's flash kernels, CUDA's and the CPU's (with two sizes SDPA falls
        back to its math kernel, which keeps the whole score matrix for backward: 1.3 GiB a block
        at 16 heads x 4096 tokens). v is padded with zeros and the padding cut from the output, unless
        `narrow_value_attention` is set and attention_fn is still SDPA's: then it takes v as it is."""
        extra = () if documents is None else (documents,)  # context parallel's document ids
        if v.shape[-1] == q.shape[-1]:
            return self.attention_fn(q, k, v, *extra)
        if self.narrow_value_attention is not None and self.attention_fn is causal_attention and documents is None:
            return self.narrow_value_attention(q, k, v)
        return self.attention_fn(q, k, _pad_last(v, q.shape[-1]), *extra)[..., : v.shape[-1]]

    def param_init_specs(self, init_std: float, out_std: float) -> dict[str, InitSpec]:
        """Projections at init_std, the latent norms at one, the output projection at out_std."""
        names = ("wq_a", "wq_b") if self.shape.q_rank else ("wq",)
        specs: dict[str, InitSpec] = {f"{n}.weight": trunc_normal(init_std) for n in (*names, "wkv_a", "wkv_b")}
        specs["wo.weight"] = trunc_normal(out_std)
        specs["kv_norm.weight"] = ONES
        if self.shape.q_rank:
            specs["q_norm.weight"] = ONES
        return specs


def _pad_last(v: torch.Tensor, width: int) -> torch.Tensor:
    return v if v.shape[-1] == width else F.pad(v, (0, width - v.shape[-1]))


@dataclass
class LayerLatentCache:
    """One layer's view of a `LatentCache` during one forward call."""

    latents: torch.Tensor
    """(batch, max_len, kv_rank) buffer."""
    rope_keys: torch.Tensor
    """(batch, max_len, rope_dim) buffer."""
    start: int
    """Slot where this call's first token goes."""

    def update(self, c: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store c / k_rope (batch, seq, ...) at [start, start+seq); return slots [0, start+seq)."""
        end = self.start + c.shape[1]
        self.latents[:, self.start:end] = c
        self.rope_keys[:, self.start:end] = k_rope
        return self.latents[:, :end], self.rope_keys[:, :end]


def deinterleave_rows(weight: torch.Tensor, head_width: int, rope_start: int, rope_dim: int,
                      to_interleaved: bool) -> torch.Tensor:
    """`weight`'s rows in blocks of `head_width`, each block's RoPE rows [rope_start, rope_start +
    rope_dim) moved from interleaved pairs (x0, x1, x2, ...) to halves (x0, x2, ..., x1, x3, ...), or
    back with `to_interleaved`. Only the order changes: q·k is the same in either."""
    rows = weight.view(-1, head_width, *weight.shape[1:])
    rope = rows[:, rope_start:rope_start + rope_dim]
    if to_interleaved:
        reordered = torch.stack([rope[:, : rope_dim // 2], rope[:, rope_dim // 2:]], dim=2).flatten(1, 2)
    else:
        reordered = torch.cat([rope[:, 0::2], rope[:, 1::2]], dim=1)
    out = rows.clone()
    out[:, rope_start:rope_start + rope_dim] = reordered
    return out.view_as(weight)


class LatentCache(KVCache):
    """A generation cache of MLA layers: per layer and token the latent and the RoPE key (see the
    module docstring); slots, padding and positions as `KVCache`."""

    description = "MLA latent cache"

    def __init__(self, n_layers: int, batch: int, max_len: int, kv_rank: int, rope_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        self.latents = [torch.zeros(batch, max_len, kv_rank, dtype=dtype, device=device) for _ in range(n_layers)]
        self.rope_keys = [torch.zeros(batch, max_len, rope_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.has_padding = False
        self.max_len = max_len
        self.length = 0

    def layer(self, index: int) -> LayerLatentCache:  # type: ignore[override]
        return LayerLatentCache(self.latents[index], self.rope_keys[index], self.length)
