"""Slow ranks named: each rank's compute time per step, gathered every logging step, and the
rank slower than the others' median by SLOW_MARGIN named in the log line and in metrics.jsonl.

In synchronous training every rank's step takes the same wall time: the collectives make the
fast ranks wait for the slowest. What differs is how the time splits between computing and
waiting, and a rank's own clock tells it: the CPU time of its training thread is its work, and
the rest of the step's wall time is spent blocked (in collectives, or waiting for the data).
Every logging step, one all-gather of two numbers per rank (compute and wall seconds per step
over the window) gives rank 0 the picture:

    slowest_rank      the rank with the most compute per step
    slowest_rank_s    its compute seconds per step
    median_rank_s     the median of the other ranks' compute per step
    slow_rank_named   True when slowest_rank_s > (1 + SLOW_MARGIN) x median_rank_s and the
                      difference is at least MIN_STEP_SHARE of the step's wall time (and
                      MIN_GAP_S): the log line then names it

What this sees: work on the host (the CPU path's compute, data preparation, Python, a busy
neighbour process on a shared host); a CUDA rank's kernels run asynchronously and are not in
its thread's CPU time, so a GPU slow in its kernels shows only through the others' waiting.
A rank that stopped altogether is the hang watchdog's to name (runtime/watchdog.py).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

SLOW_MARGIN = 0.25
"""A rank is named when its compute per step exceeds the other ranks' median by this fraction."""
MIN_GAP_S = 1e-3
"""...and by at least this many seconds (on a tiny step, scheduler noise is a large fraction)."""
MIN_STEP_SHARE = 0.1
"""...and by at least this fraction of the step's wall time. On GPUs the thread's CPU time is
kernel launches, tens of ms that vary from rank to rank by more than SLOW_MARGIN in a healthy run
(docs/performance.md): a difference that costs the step less than this is not worth a name."""


def slowest(compute_s: list[float], step_wall_s: float = 0.0) -> dict[str, Any]:
    """The record's keys for these per-rank compute seconds per step (rank = list index), in
    steps of `step_wall_s` seconds."""
    rank = max(range(len(compute_s)), key=lambda r: compute_s[r])
    # The others' median: with two ranks the median of all would be halfway to the slow one.
    others = compute_s[:rank] + compute_s[rank + 1:]
    median = statistics.median(others) if others else compute_s[rank]
    gap = compute_s[rank] - median
    named = compute_s[rank] > (1 + SLOW_MARGIN) * median and gap >= max(MIN_GAP_S, MIN_STEP_SHARE * step_wall_s)
    return {"slowest_rank": rank, "slowest_rank_s": compute_s[rank], "median_rank_s": median,
            "slow_rank_named": named}


class SlowRankMeter:
    """Times this rank's steps (start_step / end_step) and gathers every rank's at logging steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._compute = 0.0
        self._wall = 0.0
        self._steps = 0
        self._start: tuple[float, float] | None = None

    def start_step(self) -> None:
        self._start = (time.perf_counter(), time.thread_time())

    def end_step(self) -> None:
        if self._start is None:
            return
        wall0, cpu0 = self._start
        self._wall += time.perf_counter() - wall0
        self._compute += time.thread_time() - cpu0
        self._steps += 1
        self._start = None

    def report(self) -> dict[str, Any]:
        """Every rank (a collective over the world when there is one): the window's figures, reset."""
        return self.summarize(self.gather().tolist())

    def gather(self) -> torch.Tensor:
        """Every rank (a collective): (compute s, wall s) per step of each rank, flat on the device, reset;
        `summarize` makes the record's keys once they are read (with the log record's others)."""
        steps = max(self._steps, 1)
        # Made on the host, copied without blocking: torch.tensor(..., device=cuda) synchronizes the stream.
        mine = torch.tensor([self._compute / steps, self._wall / steps], dtype=torch.float64).to(self.device,
                                                                                                  non_blocking=True)
        self._compute = self._wall = 0.0
        self._steps = 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, mine)
            return torch.cat(everyone)
        return mine

    @staticmethod
    def summarize(values: list[float]) -> dict[str, Any]:
        """The record's keys from `gather`'s values read on the host."""
        rows = list(zip(values[::2], values[1::2]))
        wall = max(w for _, w in rows)
        return {**slowest([compute for compute, _ in rows], wall), "step_wall_s": wall}
