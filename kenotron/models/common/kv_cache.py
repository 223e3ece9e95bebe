"""Key/value cache for incremental decoding: preallocated per layer, filled left to right.

Slot s of every sequence holds the token fed at step s, so a batch shares one position per
slot. Batches of prompts of different lengths are left-padded; `valid` records which slots
hold real tokens so attention skips the padding (RoPE depends only on the distance between
two positions, so a shifted start changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerKVCache:
    """One layer's view of the cache during one forward call."""

    keys: torch.Tensor
    """(batch, kv_heads, max_len, head_dim) buffer."""
    values: torch.Tensor
    """Same shape as keys."""
    start: int
    """Slot where this call's first token goes."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v (batch, kv_heads, seq, head_dim) at [start, start+seq); return slots [0, start+seq)."""
        end = self.start + k.shape[2]
        self.keys[:, :, self.start : end] = k
        self.values[:, :, self.start : end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """Keys and values of every layer for `batch` sequences of up to `max_len` tokens."""

    description = "attention KV cache"
    """What the cache holds, in words (for messages)."""

    def __init__(
        self, n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int, *,
        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
    ) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.has_padding = False
        self.max_len = max_len
        self.length = 0
        """Slots filled so far (the position of the next token)."""

    def layer(self, index: int) -> LayerKVCache:
        return LayerKVCache(self.keys[index], self.values[index], self.length)

    def append(self, seqlen: int, token_mask: torch.Tensor | None) -> None:
        """Reserve the next `seqlen` slots; `token_mask` (batch, seqlen) marks real tokens (None: all)."""
        if self.length + seqlen > self.max_len:
            raise ValueError(
                f"the generation cache holds {self.max_len} tokens and {self.length} are used: {seqlen} more do not fit; "
                f"build it (and the model's max_seq_len) with max_len >= prompt length + new tokens"
            )
        if token_mask is not None:
            self.valid[:, self.length : self.length + seqlen] = token_mask
            self.has_padding = self.has_padding or not bool(token_mask.all())

    def advance(self, seqlen: int) -> None:
        """Mark the reserved slots as filled (after every layer wrote them)."""
        self.length += seqlen
