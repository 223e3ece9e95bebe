"""Cross-entropy for next-token prediction."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token losses, in fp32; labels equal to IGNORE_INDEX do not count.

    The trainer divides by the number of label tokens of the whole global batch, so every
    micro-batch on every rank contributes with the same weight per token and the result is
    the mean over the global batch whatever the layout.
    """
    return F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
    )
