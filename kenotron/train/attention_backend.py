"""Which fused SDPA kernel runs the attention, chosen once per run.

On an H200 (torch 2.11, bf16, causal, GQA) cuDNN's attention ran forward+backward 1.6x faster
than the flash kernel torch picks by default (see docs/performance.md). "auto" therefore
puts cuDNN first on CUDA, then flash, efficient and math, with torch trying them in that
order; a named backend is used alone (and torch errors if it cannot run the shapes). On CPU
"auto" leaves the choice to torch. The choice is made by a context around the model's
forward: the kernel picked in forward also runs the backward.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

NAMED = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CUDA_AUTO_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_context(backend: str, device: torch.device) -> contextlib.AbstractContextManager:
    if backend == "auto":
        if device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel(CUDA_AUTO_ORDER, set_priority=True)
    if backend not in NAMED:
        raise ValueError(f"model.attention_backend={backend!r} is not one of auto, {', '.join(NAMED)}")
    return sdpa_kernel([NAMED[backend]])
