"""The throughput model's pipeline step (pipeline_timeline.py) on torch's own orders: equal stages
give each schedule's textbook bubble, and the slowest rank sets the pace."""

from __future__ import annotations

import pytest

from kenotron.estimate.pipeline_order import schedule_orders
from kenotron.parallel.pipeline import PipelineSplit
from kenotron.planner.pipeline_timeline import build_timeline, step_seconds


def equal_stage_step(schedule: str, pp: int, stages_per_rank: int, microbatches: int) -> float:
    """Seconds of one schedule step when every rank's microbatch takes 1 s (its stages share it)."""
    n = pp * stages_per_rank
    split = PipelineSplit([["unit"]] * n, pp, schedule, microbatches)
    timeline = build_timeline(schedule_orders(split), n)
    return step_seconds(timeline, dict.fromkeys(range(n), 1 / stages_per_rank), dict.fromkeys(range(n), 0.0), pp)


@pytest.mark.parametrize(
    "schedule,stages_per_rank,bubble",
    [
        ("1F1B", 1, 3.0),  # (pp - 1) microbatch slots
        ("GPipe", 1, 3.0),
        ("Interleaved1F1B", 2, 1.5),  # (pp - 1) / v
        ("Interleaved1F1B", 4, 0.75),
        ("InterleavedZeroBubble", 2, 0.5),  # only the forwards fill: (pp - 1) / (3 v)
        ("ZBVZeroBubble", 2, 0.5),
        ("DualPipeV", 2, 0.5),
    ],
)
def test_equal_stages_give_each_schedules_textbook_bubble(schedule, stages_per_rank, bubble):
    assert equal_stage_step(schedule, 4, stages_per_rank, 8) == pytest.approx(8 + bubble)


def test_the_slowest_stage_sets_the_pace_and_the_others_fill_and_drain_once():
    # 1F1B on 4 ranks, the last stage twice as slow (the output layer and the loss): 8 of its
    # microbatches, and the other three stages' forward before it and backward after it.
    split = PipelineSplit([["unit"]] * 4, 4, "1F1B", 8)
    seconds = step_seconds(build_timeline(schedule_orders(split), 4), {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0},
                           dict.fromkeys(range(4), 0.0), 4)
    assert seconds == pytest.approx(8 * 2.0 + 3 * 1.0)
