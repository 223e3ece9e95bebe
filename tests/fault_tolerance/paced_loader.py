"""A data loader for the fault-tolerance tests: seeded random token windows, the global batch of
step s fixed whatever the dp layout (rank r of D takes the r-th slice). `build_gated` waits
GATED_S per step while the file that data.path names exists: a test keeps the groups stepping
slowly while it kills and restarts some (a few seconds per kill and restart on a busy machine:
the steps it takes are the run's steps that go by gated), then removes the file and the run ends
at full speed."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from kenotron.data import LoaderContext, MicroBatch

GATED_S = 0.5
"""Seconds per step of `build_gated`'s loader while its gate file exists (it runs ahead in
kenotron's prefetch thread, so this paces the steps)."""


class SeededWindows:
    """Step s, row i of the global batch: random tokens from the seed (s, i). State: the step."""

    def __init__(self, ctx: LoaderContext, gate: Path | None) -> None:
        self.ctx, self.gate, self.step = ctx, gate, 0

    def next_step(self) -> list[MicroBatch]:
        ctx = self.ctx
        if self.gate is not None and self.gate.exists():
            time.sleep(GATED_S)
        per_rank = ctx.global_batch_size // ctx.dp_size
        rows = []
        for i in range(ctx.dp_rank * per_rank, (ctx.dp_rank + 1) * per_rank):
            g = torch.Generator().manual_seed(self.step * 100_003 + i)
            rows.append(torch.randint(0, min(ctx.vocab_size, 50), (ctx.seq_len + 1,), generator=g))
        self.step += 1
        batch = torch.stack(rows)
        return [MicroBatch(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
                for chunk in batch.split(ctx.local_batch_size)]

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def build(ctx: LoaderContext) -> SeededWindows:
    return SeededWindows(ctx, None)


def build_gated(ctx: LoaderContext) -> SeededWindows:
    return SeededWindows(ctx, Path(ctx.cfg.data.path))


def _slice(ctx: LoaderContext, index: int, of: int) -> SeededWindows:
    """One process reading what replica group `index` of `of` reads (its slice of the groups' batch)."""
    return SeededWindows(dataclasses.replace(ctx, dp_rank=index, dp_size=of,
                                             global_batch_size=of * ctx.global_batch_size), None)


def build_slice_0(ctx: LoaderContext) -> SeededWindows:
    return _slice(ctx, 0, 2)


def build_slice_1(ctx: LoaderContext) -> SeededWindows:
    return _slice(ctx, 1, 2)
