"""A stand-in for FlashAttention-4's interface module (`flash_attn.cute.interface`), which needs an
SM90+ GPU: its two private kernels, `_flash_attn_fwd` and `_flash_attn_bwd`, with FA4's calling
convention, written out in fp32 math (not through autograd), so the backward really consumes
the log-sum-exp the forward returned.

Each checks the contract kenotron's custom ops must meet: (batch, seq, heads, head_dim),
contiguous, half precision (or `dtypes`), causal, k/v heads a divisor of the q heads, and for
the backward an fp32 log-sum-exp of shape (batch, heads, seq).
"""

from __future__ import annotations

import math
from types import ModuleType

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, s, kv_heads, d) -> (b, s, heads, d): query head i reads kv head i // (heads / kv_heads)."""
    return t.repeat_interleave(heads // t.shape[2], dim=2)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), _expand_kv(k, q.shape[2]).float()) * scale
    seq = q.shape[1]
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(future, -math.inf)


def fake_flash_attn4(dtypes: tuple[torch.dtype, ...] = HALF_DTYPES) -> ModuleType:
    """The module object; `module.calls` lists ("fwd" | "bwd", q shape, k shape)."""
    module = ModuleType("flash_attn.cute.interface")
    module.calls = []

    def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
        assert causal is True, "kenotron's training path is causal"
        assert q.dim() == k.dim() == v.dim() == 4 and k.shape == v.shape, (q.shape, k.shape, v.shape)
        assert q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3], (q.shape, k.shape)
        assert q.shape[2] % k.shape[2] == 0, f"{q.shape[2]} query heads over {k.shape[2]} kv heads"
        assert all(t.is_contiguous() for t in (q, k, v)), "FA4 is handed contiguous (b, s, h, d) tensors"
        assert q.dtype in dtypes and k.dtype == q.dtype and v.dtype == q.dtype, q.dtype

    def _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, return_lse=False, **kwargs):
        check(q, k, v, causal)
        module.calls.append(("fwd", tuple(q.shape), tuple(k.shape)))
        s = _scores(q, k, softmax_scale)
        lse = torch.logsumexp(s, dim=-1)  # (b, h, s)
        p = torch.exp(s - lse[..., None])
        out = torch.einsum("bhqk,bkhd->bqhd", p, _expand_kv(v, q.shape[2]).float()).to(q.dtype)
        return out, lse, None, None, None  # FA4 4.0.0b36 returns five fields

    def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, **kwargs):
        check(q, k, v, causal)
        assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1]), lse.shape
        assert dout.shape == out.shape == q.shape and dout.is_contiguous()
        module.calls.append(("bwd", tuple(q.shape), tuple(k.shape)))
        heads, group = q.shape[2], q.shape[2] // k.shape[2]
        p = torch.exp(_scores(q, k, softmax_scale) - lse[..., None])  # the forward's probabilities
        do, o = dout.float(), out.float()
        dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
        dp = torch.einsum("bqhd,bkhd->bhqk", do, _expand_kv(v, heads).float())
        delta = (do * o).sum(-1).transpose(1, 2)  # (b, h, s): rowsum(dO * O)
        ds = p * (dp - delta[..., None]) * softmax_scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, _expand_kv(k, heads).float())
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float())

        def fold(t: torch.Tensor) -> torch.Tensor:  # sum the query heads that share a kv head
            b, s, _, d = t.shape
            return t.reshape(b, s, heads // group, group, d).sum(3)

        return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)

    module._flash_attn_fwd = _flash_attn_fwd
    module._flash_attn_bwd = _flash_attn_bwd
    return module
