"""One pipeline rank's tracked step and where its memory is read (pipeline_memory.py's pieces):
the rank's stages built on fake tensors and warmed up, one schedule step tracked in the order
torch's schedule runs it on that rank (track_pipeline_step), each position named so that it is
the same at any number of blocks per stage (Place, places), and the positions of the full
microbatch order read off a shortened one (expand_microbatches)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch._subclasses.fake_tensor import FakeTensorMode

from kenotron.dtensor import local_tensor
from kenotron.estimate.breakdown import Breakdown, TrackedStep, allocated_bytes
from kenotron.estimate.cuda_kernels import cuda_kernel_memory
from kenotron.estimate.depth import extrapolate_line
from kenotron.estimate.fake_job import (
    DeviceBatches,
    build_fake_job,
    estimated_run,
    fake_process_group,
    simulated_micro_steps,
)
from kenotron.estimate.fake_tensor_recorder import FakeTensorRecorder
from kenotron.estimate.pipeline_order import Action, counts_before, microbatch_roles, rank_actions
from kenotron.estimate.pipeline_replay import Numbering, SimulatedPipeline, StagesTracker, run_actions
from kenotron.train.resolve import ResolvedRun
from kenotron.train.step import NO_OBSERVER, clip_gradients, optimizer_step, train_step
from kenotron.train.training_job import TrainingJob


@dataclass(frozen=True)
class Place:
    """A position of a pipeline step that is the same at any number of blocks per stage."""

    phase: str
    number: int
    """The Numbering of the action (0 for "start" and "optimizer")."""
    where: str
    """"before"/"after" the stage's blocks, its "first"/"second"/"penultimate"/"last" block,
    "block j" (a middle block, full-depth runs only), or ""."""


@dataclass
class RankStep:
    """One tracked step of one pipeline rank, with what is needed to read its positions."""

    step: TrackedStep
    actions: list[Action]
    numbering: Numbering
    counts: dict[int, int]
    """Blocks per local stage in this run."""
    kept: int = 0
    """Bytes a microbatch keeps in flight on the (single) stage: its second forward's activations, less its output."""
    chunk: int = 0
    """Bytes of one microbatch's output kept by the last stage (0 on other stages)."""
    buffers: int = 0
    """Receive buffers' bytes per microbatch."""
    simulated_rank: int = 0
    """The global rank whose fake job ran."""


def _warmup(job: TrainingJob, pipe: SimulatedPipeline) -> None:
    """One microbatch forward through every local stage and back, the reduction, the optimizer step."""
    local = sorted(pipe.stages)
    actions = ([Action("F", s, 0) for s in local] + [Action("B", s, 0) for s in reversed(local)]
               + [Action("REDUCE_GRAD", s) for s in local])
    run_actions(pipe, actions, Numbering(tuple(local), pipe.split.microbatches, len(actions)), 0, NO_OBSERVER)
    pipe.tied.sum_gradients_()
    clip_gradients(job)
    optimizer_step(job)
    for stage in pipe.stages.values():  # torch clears these when the next schedule step starts
        stage.clear_runtime_states()


def _kept_by_forward(tracker: StagesTracker, number: int) -> int:
    """Bytes created by the forward numbered `number` and alive when it ended."""
    end = tracker._forward_end[number]
    return sum(s.nbytes for s in tracker._events.storages if s.origin == "forward" and s.micro_step == number
               and (s.freed_at is None or s.freed_at > end))


def track_pipeline_step(run: ResolvedRun, rank: int, reduced: bool = False) -> RankStep:
    """Build rank `rank`'s stages on fake tensors, warm up, then track one step in the schedule's
    order (`reduced`: the shortened single-stage order, see expand_microbatches)."""
    run = estimated_run(run)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_process_group(run.dims.world_size, rank), cuda_kernel_memory():
        # What the build and the warm-up make, for the state libraries keep (register_other_live_tensors).
        with FakeTensorRecorder(mode) as made:
            job = build_fake_job(run, mode, pipeline=lambda j: SimulatedPipeline(j, mode))
            pipe = job.pipeline
            assert isinstance(pipe, SimulatedPipeline)
            with mode:
                _warmup(job, pipe)
        pp_mesh = job.meshes.get("pp")
        assert pp_mesh is not None
        actions = rank_actions(pipe.split, pp_mesh.get_local_rank(), reduced)
        local = sorted(pipe.stages)
        numbering = Numbering(tuple(local), pipe.split.microbatches, len(actions))
        with mode:
            pipe.actions, pipe.numbering = actions, numbering
            tracker = StagesTracker(job.model_parts, [pipe.stages[s].blocks for s in local])
            tracker.register_static([t for p in job.model_parts for t in [*p.parameters(), *p.buffers()]],
                                    "parameters")
            tracker.register_static(job.optimizer_state(), "optimizer_state")
            # Communication buffers, allocated once by torch's stages (one per microbatch).
            tracker.register_static(pipe.receive_buffers(), "temporaries")
            tracker.register_other_live_tensors("parameters", made.alive())
            with tracker:
                train_step(job, DeviceBatches(run, simulated_micro_steps(run)), tracker)
        counts = {s: len(pipe.stages[s].blocks) for s in local}
        kept = chunk = buffers = 0
        if reduced:  # what one more microbatch adds (see expand_microbatches)
            stage = pipe.stages[local[0]]
            output = stage.output_chunks[0] if stage.is_last and stage.output_chunks else None
            output = local_tensor(output)  # vocab-parallel logits
            chunk = allocated_bytes(output.untyped_storage().nbytes()) if output is not None else 0
            kept = _kept_by_forward(tracker, numbering.of(0, Action("F", local[0], 1), 0)) - chunk
            buffers = sum(allocated_bytes(b[0].untyped_storage().nbytes())
                          for b in (stage.act_buffers, stage.grad_buffers) if b)
    return RankStep(tracker.result(), actions, numbering, counts, kept, chunk, buffers, rank)


def expand_microbatches(
    reduced: RankStep, full: list[Action], numbering: Numbering, micro_steps: int
) -> dict[Place, Breakdown]:
    """Places of the full single-stage order from a run of its shortened order (REDUCED_MICROBATCHES).

    Microbatches are alike: an action's memory is set by its kind and role (microbatch_roles)
    plus what the other microbatches hold, which is linear in their number: the activations of
    those in flight (`kept` each), the last stage's outputs (`chunk` each, and as many again
    in the merge at the step's end), and the receive buffers (one per microbatch). Each action
    of the full order is read at the shortened order's action of the same role, shifted by the
    difference in those counts.
    """
    short = reduced.actions
    short_roles = microbatch_roles(short)
    representative = {role: i for i, role in enumerate(short_roles)}  # the last of each role
    peaks = places(reduced)
    extra_buffers = (numbering.microbatches - reduced.numbering.microbatches) * reduced.buffers
    extra_chunks = (numbering.microbatches - reduced.numbering.microbatches) * reduced.chunk
    # Where each full position is read in the short run (by phase and number), and what to add there.
    read: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for micro_step in range(micro_steps):
        for i, role in enumerate(microbatch_roles(full)):
            j = representative[role]
            flight, forwards = counts_before(full, i)
            short_flight, short_forwards = counts_before(short, j)
            add = (flight - short_flight) * reduced.kept + (forwards - short_forwards) * reduced.chunk
            key = ("forward" if full[i].kind == "F" else "backward", reduced.numbering.of(micro_step, short[j], j))
            read.setdefault(key, []).append((numbering.of(micro_step, full[i], i), add, 0))
        read.setdefault(("backward", reduced.numbering.merge(micro_step)), []).append(
            (numbering.merge(micro_step), extra_chunks, extra_chunks))
    out: dict[Place, Breakdown] = {}
    for place, b in peaks.items():
        targets = read.get((place.phase, place.number), [(place.number, extra_chunks if place.phase == "optimizer" else 0, 0)])
        for number, activations, temporaries in targets:
            out[Place(place.phase, number, place.where)] = dataclasses.replace(
                b, activations=b.activations + activations, temporaries=b.temporaries + temporaries + extra_buffers)
    return out


def _block_names(j: int, k: int) -> list[str]:
    """Names of block j of a stage of k blocks (block 1 of 3 is both second and penultimate)."""
    names = [name for index, name in ((0, "first"), (k - 1, "last")) if index == j]
    if 0 < j < k - 1:
        names += [name for index, name in ((1, "second"), (k - 2, "penultimate")) if index == j]
    return names or [f"block {j}"]


def places(run: RankStep) -> dict[Place, Breakdown]:
    """Each position's breakdown under its depth-independent name (the highest where several map to one)."""
    starts, offset = [], 0
    for s in sorted(run.counts):
        starts.append((offset, run.counts[s]))
        offset += run.counts[s]
    out: dict[Place, Breakdown] = {}
    for position, breakdown in run.step.peaks.items():
        if position.block is None:
            names = [position.edge]
        else:
            start, k = next((a, k) for a, k in starts if a <= position.block < a + k)
            names = _block_names(position.block - start, k)
        number = position.micro_step if position.phase in ("forward", "backward") else 0
        for where in names:
            place = Place(position.phase, number, where)
            if place not in out or breakdown.total > out[place].total:
                out[place] = breakdown
    return out


def extrapolate(a: dict[Place, Breakdown], b: dict[Place, Breakdown], steps: int) -> dict[Place, Breakdown]:
    """Each place at u + steps blocks per stage, from runs at u (`a`) and u + 1 (`b`): a + steps·(b - a)."""
    return extrapolate_line(a, b, steps)


def _in_flight_before(actions: list[Action], index: int, stage: int) -> int:
    done = actions[:index]
    return sum(a.stage == stage and a.kind == "F" for a in done) - sum(
        a.stage == stage and a.kind in ("B", "W") for a in done)


def describe_place(place: Place, run: RankStep, stages_last: int) -> str:
    """In words: which action of the schedule, which stage and microbatch, where in the stage."""
    if place.phase == "start":
        return "between steps"
    if place.phase == "optimizer":
        return "clipping and optimizer step"
    micro_step, what, action = run.numbering.decode(place.number, run.actions)
    micro = f", micro-step {micro_step + 1}" if micro_step else ""
    if what == "merge":
        return f"end of the schedule step{micro}, merging the last stage's outputs"
    assert action is not None
    if what == "action":
        name = {"UNSHARD": "FSDP unshard", "RESHARD": "FSDP reshard", "REDUCE_GRAD": "gradient reduction"}
        return f"{name.get(action.kind, action.kind)} of stage {action.stage}{micro}"
    stage, m = action.stage, action.microbatch
    kind = "forward" if place.phase == "forward" else ("weight backward" if what == "weight" else "backward")
    index = next(i for i, a in enumerate(run.actions) if a.stage == stage and a.microbatch == m
                 and (a.kind == "F") == (kind == "forward") and (a.kind == "W") == (what == "weight"))
    flight = _in_flight_before(run.actions, index, stage) + (kind == "forward")
    where = {"before": "stage input" if stage else "embedding",
             "after": "output and loss" if stage == stages_last else "stage output", "": ""}.get(
        place.where, f"{place.where} block")
    return f"{kind} of microbatch {m} on stage {stage} ({flight} in flight){micro}" + (f", {where}" if where else "")
