"""bench_worker's profiled steps start on every rank at once (kenotron/tools/bench_worker.py)."""

from __future__ import annotations

import time

import torch

from tests.distributed.pool import run_on_ranks

LATE = 1.0
"""Seconds by which rank 1 reaches the profiler after rank 0."""


def _first_step_time(late_rank: int) -> float:
    import torch.distributed as dist

    from kenotron.tools.bench_worker import profiled_together

    if dist.get_rank() == late_rank:
        time.sleep(LATE)
    with profiled_together(torch.device("cpu")):
        return time.monotonic()  # system-wide on Linux: comparable between the ranks' processes


def test_profiled_steps_start_together_on_every_rank_when_one_rank_reaches_the_profiler_late():
    """Without the barrier inside the profiler the late rank starts its traced steps LATE seconds
    after the other, whose first collective then waits and counts as exposed communication."""
    starts = run_on_ranks(2, _first_step_time, 1)
    assert abs(starts[0] - starts[1]) < LATE / 2, starts
