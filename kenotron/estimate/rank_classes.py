"""The groups of ranks that hold the same things and run the same step: one rank of each is simulated."""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.degrees import ParallelDims


@dataclass(frozen=True)
class RankClass:
    """Ranks that hold the same parameters and run the same step."""

    description: str
    """In words, e.g. "all 64 ranks" or "pipeline stage 1 (ranks 16-31)"."""
    rank: int
    """The rank simulated for the whole class."""


def rank_classes(dims: ParallelDims) -> list[RankClass]:
    """All ranks are alike without pipeline parallel; with it, each stage is its own class."""
    if dims.pp == 1:
        return [RankClass(f"all {dims.world_size} ranks", 0)]
    per_stage = dims.world_size // dims.pp
    return [
        RankClass(f"pipeline stage {s} (ranks {s * per_stage}-{(s + 1) * per_stage - 1})", s * per_stage)
        for s in range(dims.pp)
    ]
