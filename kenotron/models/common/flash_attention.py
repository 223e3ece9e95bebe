"""The `flash-attn` package as the causal attention kernel (`model.attention_backend = "flash_attn"`).

`flash_attn.flash_attn_func(q, k, v, causal=True)` takes (batch, seq, heads, head_dim) in
fp16/bf16 and handles grouped-query attention itself (k/v may have fewer heads, a divisor of
the query heads), so nothing is repeated. FlashAttention-3 (`flash_attn_interface`, built
from the package's `hopper/` folder) is preferred on Hopper GPUs when it is importable.

The package is imported lazily, only when this backend is chosen: kenotron does not need it
otherwise, and importing it loads CUDA kernels. `FlashAttention` is the drop-in
`attention_fn` of an attention module (see attention.py): it sees the local tensors, so under
tensor parallel it attends over this rank's heads like SDPA does.

flash-attn >= 2.7 registers its kernels as torch custom ops, which lets torch.compile trace
the blocks whole; older versions break the graph (the trainer refuses them with compile).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import torch

INSTALL_HINT = "pip install flash-attn (or pip install -e '.[flash]')"
MIN_COMPILE_VERSION = (2, 7)


class FlashAttnUnavailable(ImportError):
    """The flash-attn package is not installed (or does not import)."""


def import_flash_attn() -> ModuleType:
    """The `flash_attn` module, or FlashAttnUnavailable saying how to install it."""
    try:
        return importlib.import_module("flash_attn")
    except ImportError as e:
        raise FlashAttnUnavailable(f"the flash-attn package is not installed ({e}); {INSTALL_HINT}") from e


def flash_attn_version(module: ModuleType) -> tuple[int, ...]:
    """(major, minor) of an imported flash_attn module; (0,) when it carries no version."""
    parts = []
    for piece in str(getattr(module, "__version__", "0")).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class FlashAttention:
    """Causal attention through flash-attn on (batch, heads, seq, head_dim), as SDPA is called.

    Not an nn.Module: it holds no state worth a place in the module tree or the state dict.
    """

    def __init__(self, func: Callable[..., object], version: int) -> None:
        self.func = func
        """flash_attn_func of FlashAttention-2 or -3."""
        self.version = version
        """2 or 3."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # GQAttention hands (b, h, s, d) views of (b, s, h, d) tensors: transposing back is free
        # and gives flash-attn the layout it wants (last dimension contiguous).
        out = self.func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        if isinstance(out, tuple):  # some FlashAttention-3 builds also return the log-sum-exp
            out = out[0]
        return out.transpose(1, 2)

    def __repr__(self) -> str:
        return f"FlashAttention(version={self.version})"


def load_flash_attention(prefer_v3: bool) -> FlashAttention:
    """FlashAttention-3 when `prefer_v3` (a Hopper GPU) and `flash_attn_interface` imports, else -2.

    Raises FlashAttnUnavailable when flash-attn is not installed.
    """
    if prefer_v3:
        try:
            fa3 = importlib.import_module("flash_attn_interface")
        except ImportError:
            fa3 = None
        if fa3 is not None:
            return FlashAttention(fa3.flash_attn_func, 3)
    return FlashAttention(import_flash_attn().flash_attn_func, 2)


def is_hopper(device: torch.device) -> bool:
    """Compute capability 9.x (H100, H200): where FlashAttention-3 runs."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
