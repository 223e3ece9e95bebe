"""The cross-group all-reduce's timeout per step (kenotron/fault_tolerance/collective_timeout.py)."""

from __future__ import annotations

from kenotron.fault_tolerance.collective_timeout import SLOWEST_MARGIN, CollectiveTimeouts


def test_a_groups_first_step_and_a_step_where_a_group_rejoins_get_the_warm_up_timeout():
    t = CollectiveTimeouts(steady_s=10, warmup_s=120)
    assert t.for_step(2) == 120  # this group's first step: every group may be compiling
    t.completed(30.0)  # the compiling peer's wait does not set the floor
    assert t.for_step(2) == 10
    t.completed(0.5)
    assert t.for_step(1) == 10  # a peer died: the survivor is warm
    assert t.for_step(2) == 120  # it came back and compiles its first step
    assert t.for_step(2) == 10


def test_a_warm_steps_timeout_is_at_least_a_margin_over_the_slowest_warm_all_reduce():
    t = CollectiveTimeouts(steady_s=10, warmup_s=120)
    t.for_step(2)
    t.for_step(2)
    t.completed(4.0)  # a large model on a slow link
    assert t.for_step(2) == SLOWEST_MARGIN * 4.0
    t.completed(1.0)
    assert t.for_step(2) == SLOWEST_MARGIN * 4.0  # the slowest so far, not the last
