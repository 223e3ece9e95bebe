"""Activation checkpointing applied per transformer block, keeping parameter names.

Instead of wrapping a block in another module (which renames every parameter under a
`_checkpoint_wrapped_module.` prefix and breaks state-dict keys), the block's own
`forward` is replaced by a checkpointed call of the original. FSDP's hooks sit on the
block's `__call__` and torch.compile traces through `torch.utils.checkpoint`, so the order
AC -> compile -> FSDP works unchanged.
"""

from __future__ import annotations

import functools

import torch.utils.checkpoint as ckpt
from torch import nn

AC_MODES = ("none", "full")


def checkpoint_module(module: nn.Module) -> None:
    """Recompute `module`'s forward in backward instead of storing its activations."""
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return ckpt.checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

    module.forward = forward  # type: ignore[method-assign]
