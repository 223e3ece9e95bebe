"""The tokens ahead of each position that multi-token prediction reads (deepseek_v3's MTP modules:
models/deepseek_v3/mtp.py), family-neutral so that the trainer makes them (train/mtp.py) without
importing a family."""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
"""Where a position has no token that far ahead (past the window's end)."""


def future_tokens(tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """(batch, seq, depth + 1): at position t the tokens t + 1 .. t + depth + 1 of `tokens`
    (batch, seq), IGNORE_INDEX past the window's end. Module k reads column k - 1 (token t + k)
    and predicts column k."""
    if tokens.is_floating_point():
        raise RuntimeError("the MTP modules' pipeline stage gets hidden states, not token ids: pass `future` "
                           "(train/mtp.py does)")
    seqlen = tokens.shape[1]
    ahead = torch.arange(1, depth + 2, device=tokens.device)
    index = torch.arange(seqlen, device=tokens.device)[:, None] + ahead  # (seq, depth + 1)
    inside = index < seqlen
    gathered = tokens[:, index.clamp(max=seqlen - 1)]
    return gathered.masked_fill(~inside, IGNORE_INDEX)
