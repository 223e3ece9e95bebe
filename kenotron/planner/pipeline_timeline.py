"""A pipeline schedule step on a timeline: the throughput model's bubble for every schedule.

Each pipeline rank runs its actions (pipeline_order.schedule_orders: torch's order for the rank,
the same the fake-tensor estimator replays) one after the other; an action starts when the rank
is free and what it waits for is done:
  F(s, m) waits for F(s − 1, m) (the activation it receives);
  B(s, m) or I(s, m) waits for the backward of (s + 1, m) that sends its output gradient (B or I);
  W(s, m) runs after I(s, m) on the same rank (its own order puts it there).
Durations per microbatch of stage s, C_s its seconds of forward and backward: F = C_s/3, B =
2·C_s/3 (a matmul's backward is two products), I = W = C_s/3 (the zero-bubble split of B; the
first stage's I is empty and its W runs the whole backward), plus the stage's fp32 gradient
accumulation in B or W. The step lasts until the last action ends; its bubble is that less the
busiest rank's work. Point-to-point time is priced apart (throughput.pipeline_p2p).
"""

from __future__ import annotations

from dataclasses import dataclass

from kenotron.estimate.pipeline_order import Action


@dataclass(frozen=True)
class Timeline:
    """A schedule's compute actions in an order that respects every dependency, with what each
    waits for (built once per schedule, ranks, stages and microbatches)."""

    actions: list[tuple[int, Action]]
    """(pp rank, action), each rank's actions in its own order."""
    waits_for: list[int | None]
    """Index in `actions` of the action on another stage that each one waits for, or None."""
    n_stages: int


def build_timeline(orders: list[list[Action]], n_stages: int) -> Timeline:
    """The ranks' compute actions (`orders`, one list per rank) in a dependency order."""
    compute = [[a for a in order if a.kind in ("F", "B", "I", "W")] for order in orders]
    done: dict[tuple[str, int, int], int] = {}  # (F or BI, stage, microbatch) -> index in the result
    position = [0] * len(compute)
    actions: list[tuple[int, Action]] = []
    waits_for: list[int | None] = []
    while len(actions) < sum(len(c) for c in compute):
        progressed = False
        for rank, order in enumerate(compute):
            while position[rank] < len(order):
                a = order[position[rank]]
                m = a.microbatch if a.microbatch is not None else 0
                if a.kind == "F":
                    need = ("F", a.stage - 1, m) if a.stage > 0 else None
                elif a.kind in ("B", "I"):
                    need = ("BI", a.stage + 1, m) if a.stage < n_stages - 1 else None
                else:
                    need = None
                if need is not None and need not in done:
                    break
                waits_for.append(done[need] if need is not None else None)
                if a.kind in ("F", "B", "I"):
                    done[("F" if a.kind == "F" else "BI", a.stage, m)] = len(actions)
                actions.append((rank, a))
                position[rank] += 1
                progressed = True
        if not progressed:
            raise ValueError("the pipeline order waits on itself; it is not a schedule torch runs")
    return Timeline(actions, waits_for, n_stages)


def step_seconds(timeline: Timeline, stage_seconds: dict[int, float], accumulate_seconds: dict[int, float],
                 ranks: int) -> float:
    """Seconds from the first action to the last, given each stage's forward-and-backward seconds
    per microbatch and its gradient accumulation per microbatch."""
    free = [0.0] * ranks
    end = [0.0] * len(timeline.actions)
    for i, (rank, a) in enumerate(timeline.actions):
        c = stage_seconds[a.stage]
        if a.kind == "F":
            duration = c / 3
        elif a.kind == "B":
            duration = 2 * c / 3 + accumulate_seconds[a.stage]
        elif a.kind == "I":
            duration = 0.0 if a.stage == 0 else c / 3
        else:
            duration = (2 * c / 3 if a.stage == 0 else c / 3) + accumulate_seconds[a.stage]
        wait = timeline.waits_for[i]
        start = max(free[rank], end[wait] if wait is not None else 0.0)
        end[i] = free[rank] = start + duration
    return max(end, default=0.0)
