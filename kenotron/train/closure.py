"""The closure protocol of `torch.optim.Optimizer.step(closure)`, shared by kenotron's AdamWs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """What an optimizer's `step(closure)` returns: the closure's loss, evaluated with grad enabled
    (steps run under no_grad), or None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
