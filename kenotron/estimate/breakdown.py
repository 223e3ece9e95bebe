"""What a tracked step's memory is reported in: bytes as the CUDA caching allocator counts them,
by category (`Breakdown`), at a position of the step (`Position`), and the peaks of one tracked
step (`TrackedStep`). The tracker (tracker.py) produces them; depth extrapolation, the report and
the planner's closed form read and build them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

ALLOCATION_GRANULE = 512
"""The CUDA caching allocator rounds every block up to a multiple of 512 bytes."""


def allocated_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator reserves for a block of `nbytes`."""
    return math.ceil(nbytes / ALLOCATION_GRANULE) * ALLOCATION_GRANULE


@dataclass
class Breakdown:
    """Bytes on one rank at one moment, by what they hold; the fields sum to `total`."""

    parameters: int = 0
    """Sharded (or whole, without FSDP) fp32 master weights, plus buffers such as RoPE tables."""
    unsharded_parameters: int = 0
    """FSDP's gathered compute copies of the parameters of the blocks being computed."""
    gradients: int = 0
    """Parameter gradients (sharded under FSDP)."""
    optimizer_state: int = 0
    """AdamW moments and step counters."""
    activations: int = 0
    """Tensors saved by forward for backward (and their recomputation under activation checkpointing)."""
    temporaries: int = 0
    """Short-lived tensors: intermediates, gradients of activations, communication buffers, loss chunks."""

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def categories(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


CATEGORIES = Breakdown.categories()


@dataclass(frozen=True)
class Position:
    """Where in the step something happened."""

    phase: str
    """"start" (before the step), "forward", "backward" or "optimizer" (clipping and the optimizer step)."""
    micro_step: int = 0
    """Index of the micro-step (gradient accumulation) within the step."""
    block: int | None = None
    """Index of the transformer block running, None outside the blocks."""
    edge: str = ""
    """Outside the blocks: "before" them (embedding) or "after" them (final norm, output, loss)."""


@dataclass
class TrackedStep:
    """What one tracked step allocated: peaks per position and the activations per module."""

    peaks: dict[Position, Breakdown]
    """Breakdown at the highest total reached at each position."""
    activations_by_module: dict[str, int]
    """Bytes of activations alive when the first micro-step's backward starts, by creating module FQN."""

    @property
    def peak(self) -> tuple[Position, Breakdown]:
        return max(self.peaks.items(), key=lambda kv: kv[1].total)
