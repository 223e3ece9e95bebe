"""The `flash-attn` package as the causal attention kernel (`model.attention_backend = "flash_attn"`).

`flash_attn.flash_attn_func(q, k, v, causal=True)` takes (batch, seq, heads, head_dim) in
fp16/bf16 and handles grouped-query attention itself (k/v may have fewer heads, a divisor of
the query heads), so nothing is repeated. Which FlashAttention runs depends on the GPU and on
what is installed (`load_flash_attention`): on Hopper (SM90) FlashAttention-3
(`flash_attn_interface`, built from the package's `hopper/` folder), then FlashAttention-4
(`flash-attn-4`, flash_attention4.py), then FlashAttention-2; on Blackwell and later (SM100+)
FlashAttention-4, then -2; on older GPUs FlashAttention-2.

The package is imported lazily, only when this backend is chosen: kenotron does not need it
otherwise, and importing it loads CUDA kernels. `FlashAttention` is the drop-in
`attention_fn` of an attention module (see attention.py): it sees the local tensors, so under
tensor parallel it attends over this rank's heads like SDPA does.

flash-attn >= 2.7 registers its kernels as torch custom ops, which lets torch.compile trace
the blocks whole; older versions break the graph (the trainer refuses them with compile).
FlashAttention-4 is wrapped in kenotron's own custom ops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import torch

from kenotron.models.common.flash_attention4 import fa4_attention, import_fa4

INSTALL_HINT = "pip install flash-attn (or pip install -e '.[flash]'); on Hopper or Blackwell also pip install flash-attn-4"
MIN_COMPILE_VERSION = (2, 7)


class FlashAttnUnavailable(ImportError):
    """The flash-attn package is not installed (or does not import)."""


def import_flash_attn() -> ModuleType:
    """The `flash_attn` module (FlashAttention-2), or FlashAttnUnavailable saying how to install it."""
    try:
        module = importlib.import_module("flash_attn")
    except ImportError as e:
        raise FlashAttnUnavailable(f"the flash-attn package is not installed ({e}); {INSTALL_HINT}") from e
    if not hasattr(module, "flash_attn_func"):  # e.g. only flash-attn-4's flash_attn/cute/ is installed
        raise FlashAttnUnavailable(f"the flash-attn package is not installed (flash_attn has no flash_attn_func); "
                                   f"{INSTALL_HINT}")
    return module


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
        """flash_attn_func of FlashAttention-2, -3 or -4 (q, k, v, causal=...)."""
        self.version = version
        """2, 3 or 4."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # GQAttention hands (b, h, s, d) views of (b, s, h, d) tensors: transposing back is free
        # and gives flash-attn the layout it wants (last dimension contiguous).
        out = self.func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        if isinstance(out, tuple):  # some FlashAttention-3 builds also return the log-sum-exp
            out = out[0]
        return out.transpose(1, 2)

    def __repr__(self) -> str:
        return f"FlashAttention(version={self.version})"


def load_flash_attention(device_major: int) -> FlashAttention:
    """The best FlashAttention installed for a GPU of compute capability `device_major`.x
    (0 for no GPU): FlashAttention-3 on SM90 when `flash_attn_interface` imports, then
    FlashAttention-4 on SM90 and later when `flash-attn-4` imports, else FlashAttention-2.

    Raises FlashAttnUnavailable when none of them is installed.
    """
    if device_major == 9:
        try:
            fa3 = importlib.import_module("flash_attn_interface")
        except ImportError:
            fa3 = None
        if fa3 is not None:
            return FlashAttention(fa3.flash_attn_func, 3)
    if device_major >= 9 and import_fa4() is not None:
        return FlashAttention(fa4_attention, 4)
    return FlashAttention(import_flash_attn().flash_attn_func, 2)


def cuda_major(device: torch.device) -> int:
    """The compute capability's major number of a CUDA device (9: H100/H200); 0 for other devices."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_capability(device)[0]
