"""A stand-in for the flash-attn package, which cannot run here (no CUDA, not installed).

`flash_attn_func` checks the contract kenotron must meet: (batch, seq, heads, head_dim) with a
contiguous last dimension, fp16/bf16, causal=True, k/v with the same shape and a number of heads
that divides the query heads (grouped-query attention is flash-attn's job, so nothing may be
repeated before the call). It computes the result through SDPA and records each call's shapes.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch
import torch.nn.functional as F

HALF_DTYPES = (torch.bfloat16, torch.float16)


def fake_flash_attn(version: str = "2.7.4", dtypes: tuple[torch.dtype, ...] = HALF_DTYPES,
                    name: str = "flash_attn", returns_lse: bool = False) -> ModuleType:
    """A module object with flash-attn's `flash_attn_func`; `module.calls` lists (q shape, k shape).

    `dtypes`: what the kernel accepts (flash-attn: fp16/bf16; a test may widen it to fp32 to
    compare at fp32 precision). `returns_lse`: return (out, lse) as some FlashAttention-3 builds do.
    """
    module = ModuleType(name)
    module.__version__ = version
    module.calls = []

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
        assert causal is True, "kenotron's training path is causal"
        assert q.dim() == k.dim() == v.dim() == 4, "flash-attn takes 4-D (batch, seq, heads, head_dim)"
        assert k.shape == v.shape, (k.shape, v.shape)
        assert q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3], (q.shape, k.shape)
        assert q.shape[2] % k.shape[2] == 0, f"{q.shape[2]} query heads over {k.shape[2]} kv heads"
        assert all(t.stride(-1) == 1 for t in (q, k, v)), "flash-attn needs a contiguous head_dim"
        assert q.dtype in dtypes and k.dtype == q.dtype and v.dtype == q.dtype, q.dtype
        module.calls.append((tuple(q.shape), tuple(k.shape)))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=k.shape[2] != q.shape[2], scale=softmax_scale,
        ).transpose(1, 2).contiguous()
        if returns_lse:
            return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return out

    module.flash_attn_func = flash_attn_func
    return module


def install(module: ModuleType) -> None:
    """Make `import <module.__name__>` return `module` in this process (for worker processes,
    which pytest's monkeypatch does not reach; the harness's processes are reused, so
    `uninstall` afterwards)."""
    sys.modules[module.__name__] = module


def uninstall(name: str = "flash_attn") -> None:
    sys.modules.pop(name, None)
