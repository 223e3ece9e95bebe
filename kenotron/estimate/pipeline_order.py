"""The order in which a pipeline rank runs its stages' forwards and backwards, as torch does.

The estimator does not drive torch's schedules (their stages set themselves up with
point-to-point messages a fake process group cannot answer); it replays each rank's
actions in the order torch would run them:

- GPipe and 1F1B (one stage per rank) run a loop written in code, not a list of actions:
  GPipe every forward then every backward; 1F1B `min(n, stages - s)` warm-up forwards on
  stage s, then one backward and one forward at a time, then the remaining backwards (so
  stage s keeps up to pp - s microbatches in flight). Both end with the stage's gradient
  reduction. Written out here from torch's `_step_microbatches`.
- The multi-stage schedules (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
  ZBVZeroBubble, DualPipeV) compute their whole order at construction, for every rank
  (`pipeline_order`, lowered with FSDP unshard/reshard and the gradient reduction into
  `pipeline_order_with_comms`). The class is built here on stand-in stages that carry only
  indices and sizes, no module and no process group, and its list for the rank is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from torch.distributed.pipelining.schedules import get_schedule_class

from kenotron.parallel.pipeline import SINGLE_STAGE_SCHEDULES, PipelineSplit

COMPUTE_KINDS = ("F", "B", "I", "W")
"""Forward, full backward, backward for the input only, backward for the weights only."""
KINDS = COMPUTE_KINDS + ("UNSHARD", "RESHARD", "REDUCE_GRAD")

_TORCH_KINDS = {
    "FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W",
    "UNSHARD": "UNSHARD", "RESHARD": "RESHARD", "REDUCE_GRAD": "REDUCE_GRAD",
}


@dataclass(frozen=True)
class Action:
    """One step of a rank's schedule."""

    kind: str
    """One of KINDS."""
    stage: int
    """Global stage index."""
    microbatch: int | None = None
    """Microbatch index (None for UNSHARD, RESHARD, REDUCE_GRAD)."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}" + ("" if self.microbatch is None else str(self.microbatch))


def single_stage_actions(
    schedule: str, stage: int, n_stages: int, microbatches: int, max_warmup: int | None = None
) -> list[Action]:
    """GPipe / 1F1B on `stage`, as their `_step_microbatches` run it (`max_warmup` caps 1F1B's
    warm-up forwards: a shorter list with the same kinds of actions, see microbatch_roles)."""
    F = [Action("F", stage, m) for m in range(microbatches)]
    B = [Action("B", stage, m) for m in range(microbatches)]
    if schedule == "GPipe":
        order = F + B
    else:
        warmup = min(microbatches, n_stages - stage, max_warmup or microbatches)
        order = F[:warmup]
        forward = warmup
        for backward in range(microbatches):
            order.append(B[backward])
            if forward < microbatches:
                order.append(F[forward])
                forward += 1
    return order + [Action("REDUCE_GRAD", stage)]


def _stand_in_stage(index: int, n_stages: int, pp: int, pp_rank: int) -> SimpleNamespace:
    """What a multi-stage schedule's constructor reads from its stages."""
    return SimpleNamespace(
        stage_index=index, num_stages=n_stages, group_size=pp, group_rank=pp_rank, is_first=index == 0,
        is_last=index == n_stages - 1, stage_index_to_group_rank={}, submod=None, has_backward=True, chunks=None,
    )


def multi_stage_orders(split: PipelineSplit) -> list[list[Action]]:
    """Every rank's compute, FSDP and gradient-reduction actions from torch's own schedule class
    (its constructor computes the order of all ranks: built once, on rank 0's stand-in stages)."""
    stages = [_stand_in_stage(s, split.n_stages, split.pp, 0) for s in split.local_stages(0)]
    try:
        schedule = get_schedule_class(split.schedule)(
            stages, split.microbatches, loss_fn=lambda output, target: output, scale_grads=False
        )
    except Exception as error:  # a torch whose constructor reads more than the stand-in holds
        raise RuntimeError(
            f"could not read the {split.schedule} schedule's action order from this torch "
            f"({type(error).__name__}: {error}); the estimator needs torch's pipeline_order for multi-stage schedules"
        ) from error
    order = getattr(schedule, "pipeline_order_with_comms", None) or schedule.pipeline_order
    out = []
    for pp_rank in range(split.pp):
        actions: list[Action] = []
        for action in order[pp_rank]:
            if action is None:
                continue
            for sub in getattr(action, "sub_actions", None) or [action]:  # OVERLAP_F_B runs its parts in turn
                kind = _TORCH_KINDS.get(sub.computation_type.name)
                if kind is not None:  # sends and receives move no memory the estimate counts
                    actions.append(Action(kind, sub.stage_index, sub.microbatch_index if kind in COMPUTE_KINDS else None))
        out.append(actions)
    return out


def multi_stage_actions(split: PipelineSplit, pp_rank: int) -> list[Action]:
    """The rank's compute, FSDP and gradient-reduction actions from torch's own schedule class."""
    return multi_stage_orders(split)[pp_rank]


def rank_actions(split: PipelineSplit, pp_rank: int, reduced: bool = False) -> list[Action]:
    """Everything pipeline rank `pp_rank` runs in one schedule step, in order (`reduced`: the
    shortened single-stage order of REDUCED_MICROBATCHES, see microbatch_roles)."""
    if split.schedule in SINGLE_STAGE_SCHEDULES:
        (stage,) = split.local_stages(pp_rank)
        return single_stage_actions(split.schedule, stage, split.n_stages, split.microbatches, 2 if reduced else None)
    return multi_stage_actions(split, pp_rank)


def schedule_orders(split: PipelineSplit) -> list[list[Action]]:
    """Every pipeline rank's actions of one schedule step (rank_actions of each rank, the
    multi-stage schedule's class built once)."""
    if split.schedule in SINGLE_STAGE_SCHEDULES:
        return [rank_actions(split, r) for r in range(split.pp)]
    return multi_stage_orders(split)


REDUCED_MICROBATCHES = 3
"""Microbatches of the shortened single-stage order: F0 F1 B0 F2 B1 B2 under 1F1B (F0 B0 F1 B1 F2 B2
on the last stage), F0 F1 F2 B0 B1 B2 under GPipe."""


def microbatch_roles(actions: list[Action]) -> list[tuple[str, int, str]]:
    """(kind, stage, role) of each action: what, besides the number of microbatches alive, sets
    its memory. A forward is its stage's first (FSDP gathers), a warm-up one (no gradient yet)
    or a steady one; a backward the first (creates the gradients), the last, or a middle one."""
    forwards: set[int] = set()
    backwards: set[int] = set()
    last_backward = {a.stage: i for i, a in enumerate(actions) if a.kind == "B"}
    roles = []
    for i, a in enumerate(actions):
        if a.kind == "F":
            role = "first" if a.stage not in forwards else ("warm" if a.stage not in backwards else "steady")
            forwards.add(a.stage)
        elif a.kind == "B":
            role = "first" if a.stage not in backwards else ("last" if last_backward[a.stage] == i else "middle")
            backwards.add(a.stage)
        else:
            role = ""
        roles.append((a.kind, a.stage, role))
    return roles


def counts_before(actions: list[Action], index: int) -> tuple[int, int]:
    """(microbatches in flight, forwards done) on the action's stage when action `index` starts."""
    stage = actions[index].stage
    done = [a for a in actions[:index] if a.stage == stage]
    forwards = sum(a.kind == "F" for a in done)
    return forwards - sum(a.kind in ("B", "W") for a in done), forwards


def max_in_flight(actions: list[Action]) -> dict[int, int]:
    """Per stage, the most microbatches whose forward has run and whose backward has not
    released them yet (a full backward or, under zero-bubble schedules, the weight pass)."""
    alive: dict[int, int] = {}
    most: dict[int, int] = {}
    for a in actions:
        if a.kind == "F":
            alive[a.stage] = alive.get(a.stage, 0) + 1
            most[a.stage] = max(most.get(a.stage, 0), alive[a.stage])
        elif a.kind in ("B", "W"):
            alive[a.stage] -= 1
    return most
