"""Pipeline parallel estimates: every pipeline rank simulated on its own, in its schedule's order.

Ranks at the same pipeline position hold the same stages and run the same actions, so one
rank per pp coordinate is simulated (rank_classes.py). For each: the rank's stages are
built as the trainer builds them (pipeline_replay.py), a warm-up step (one microbatch through
every local stage, then the optimizer step) creates the optimizer state and FSDP's lazily
allocated buffers, then one schedule step is tracked: every microbatch's forward and
backward in the order torch's schedule runs them on that rank (pipeline_order.py), so the
activations of the microbatches the schedule keeps in flight at once are counted, then
clipping and the optimizer step.

Depth: at a given action and place within a stage (its second block, its penultimate block,
the loss, ...) memory is linear in the number of blocks per stage, as for a whole model
(depth.py). When the rank's stages are deep enough (eight blocks for one stage), two shallow
copies are run whose stages have u and u + 1 blocks (u = k - t, the smallest stage keeping
three) and each place is read off the line t steps further. Otherwise the stages run at full
depth.

Microbatches (GPipe and 1F1B, more than three): microbatches are alike, so an action's memory
is set by its role (a stage's first forward, a warm-up or steady one, the first, a middle or
the last backward) plus what the other microbatches hold, which is linear in their number.
A shortened order of three microbatches with every role is simulated and each action of the
full order read at its role, shifted by the difference (expand_microbatches); tests check it
against the full order. The multi-stage schedules run every microbatch. `full_depth` runs
everything (every block, every microbatch).

The planner's closed form prices 1F1B pipeline ranks (kenotron/planner/analytic_pipeline.py) and
searches pp with 1F1B only.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

from torch._subclasses.fake_tensor import FakeTensorMode

from kenotron.dtensor import local_tensor
from kenotron.estimate.cp_ring_memory import context_notes
from kenotron.estimate.cuda_kernels import cuda_kernel_memory
from kenotron.estimate.depth import activations_by_module, extrapolate_line
from kenotron.estimate.fake_job import (
    DeviceBatches,
    build_fake_job,
    estimated_run,
    fake_process_group,
    ignored_features,
    simulated_micro_steps,
)
from kenotron.estimate.pipeline_order import (
    REDUCED_MICROBATCHES,
    Action,
    counts_before,
    max_in_flight,
    microbatch_roles,
    rank_actions,
)
from kenotron.estimate.pipeline_replay import (
    Numbering,
    SimulatedPipeline,
    StagesTracker,
    resized_split,
    run_actions,
    stage_block_counts,
    with_microbatches,
)
from kenotron.estimate.rank_classes import rank_classes
from kenotron.estimate.report import MemoryReport, RankEstimate, describe_model, describe_settings, phase_peaks
from kenotron.estimate.static_memory import data_parallel_kind, meta_model
from kenotron.estimate.tracker import (
    Breakdown,
    TrackedStep,
    allocated_bytes,
)
from kenotron.parallel.pipeline import SINGLE_STAGE_SCHEDULES
from kenotron.train.resolve import ResolvedRun
from kenotron.train.step import NO_OBSERVER, clip_gradients, optimizer_step, train_step
from kenotron.train.training_job import TrainingJob

MIN_UNITS = 3
"""Blocks of the smallest stage in the shallower copy: its first and last blocks and one plain
block between them, named both second and penultimate (`places`), so that both shallow runs have
the four places of a deep stage (depth.py gets them from four and five blocks, naming each once)."""


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
        job = build_fake_job(run, mode, pipeline=lambda j: SimulatedPipeline(j, mode))
        pipe = job.pipeline
        assert isinstance(pipe, SimulatedPipeline)
        pp_mesh = job.meshes.get("pp")
        assert pp_mesh is not None
        actions = rank_actions(pipe.split, pp_mesh.get_local_rank(), reduced)
        local = sorted(pipe.stages)
        numbering = Numbering(tuple(local), pipe.split.microbatches, len(actions))
        with mode:
            _warmup(job, pipe)
            pipe.actions, pipe.numbering = actions, numbering
            tracker = StagesTracker(job.model_parts, [pipe.stages[s].blocks for s in local])
            tracker.register_static([t for p in job.model_parts for t in [*p.parameters(), *p.buffers()]],
                                    "parameters")
            tracker.register_static(job.optimizer_state(), "optimizer_state")
            # Communication buffers, allocated once by torch's stages (one per microbatch).
            tracker.register_static(pipe.receive_buffers(), "temporaries")
            tracker.register_other_live_tensors("parameters")
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


@dataclass(frozen=True)
class Simulation:
    """One fake run for a pipeline rank."""

    rank: int
    counts: list[int] | None
    """Blocks per stage (None: as configured)."""
    reduced: bool
    """Run the shortened single-stage order of REDUCED_MICROBATCHES microbatches (expand_microbatches)."""


def simulations(run: ResolvedRun, pp_rank: int, rank: int, full_depth: bool) -> list[Simulation]:
    """The runs that estimate pipeline rank `pp_rank`: one, or two shallow ones (see the module doc)."""
    split = run.plan.pipeline
    assert split is not None
    reduced = not full_depth and split.schedule in SINGLE_STAGE_SCHEDULES and split.microbatches > REDUCED_MICROBATCHES
    counts = stage_block_counts(split, run.plan.layout.blocks)
    local = split.local_stages(pp_rank)
    steps = min(counts[s] for s in local) - MIN_UNITS
    # Two shallow runs cost 2·Σ(k - steps) + stages blocks: worth it only when fewer than Σ k.
    # ZeRO-1's greedy partition of a stage's parameters is not linear in its blocks: full depth.
    zero1 = data_parallel_kind(run) == "zero1"
    # Multi-token-prediction modules are blocks of another cost that a shorter stage must keep: full depth.
    mtp = getattr(run.model_args, "mtp_depth", 0) > 0
    shallow_blocks = 2 * sum(counts[s] - steps for s in local) + len(local)
    if full_depth or zero1 or mtp or steps < 2 or shallow_blocks >= sum(counts[s] for s in local):
        return [Simulation(rank, None, reduced)]
    # Other ranks' stages are not built here: one block each keeps the model small.
    return [Simulation(rank, [c - steps + extra if s in local else min(c, 1) for s, c in enumerate(counts)], reduced)
            for extra in (0, 1)]


def _variant(run: ResolvedRun, sim: Simulation) -> ResolvedRun:
    if sim.counts is not None:
        run = resized_split(run, sim.counts)[0]
    if sim.reduced:  # the same microbatches, fewer of them
        run = with_microbatches(run, REDUCED_MICROBATCHES)
    return run


def simulate(run: ResolvedRun, sim: Simulation) -> RankStep:
    return track_pipeline_step(_variant(run, sim), sim.rank, sim.reduced)


def _same_run_key(run: ResolvedRun, pp_rank: int, sim: Simulation) -> tuple:
    """What a rank's simulation depends on besides its stage indices: ranks with equal keys
    (the middle stages of a shortened 1F1B order, of equal depth) have the same memory."""
    variant = _variant(run, sim)
    split = variant.plan.pipeline
    assert split is not None
    counts = stage_block_counts(split, run.plan.layout.blocks)
    local = split.local_stages(pp_rank)
    index = {stage: i for i, stage in enumerate(local)}
    actions = rank_actions(split, pp_rank, sim.reduced)
    return (tuple((s == 0, s == split.n_stages - 1, counts[s]) for s in local),
            tuple(b - a for a, b in itertools.pairwise(local)),
            tuple((a.kind, index[a.stage], a.microbatch) for a in actions))


def _relabel(step: RankStep, stages: tuple[int, ...]) -> RankStep:
    """A simulated rank's step as another rank's whose stages are `stages` (same key)."""
    to = dict(zip(step.numbering.local_stages, stages))
    return dataclasses.replace(
        step, actions=[dataclasses.replace(a, stage=to[a.stage]) for a in step.actions],
        numbering=dataclasses.replace(step.numbering, local_stages=stages),
        counts={to[s]: c for s, c in step.counts.items()},
    )


def simulate_all(run: ResolvedRun, plans: list[list[Simulation]]) -> list[list[RankStep]]:
    """Every rank's simulations, each distinct one run once."""
    split = run.plan.pipeline
    assert split is not None
    done: dict[tuple, RankStep] = {}
    out = []
    for pp_rank, sims in enumerate(plans):
        steps = []
        for sim in sims:
            key = _same_run_key(run, pp_rank, sim)
            if key not in done:
                done[key] = simulate(run, sim)
            steps.append(_relabel(done[key], tuple(split.local_stages(pp_rank))))
        out.append(steps)
    return out


def rank_places(run: ResolvedRun, pp_rank: int, step: RankStep) -> tuple[dict[Place, Breakdown], RankStep]:
    """A run's places under the configured microbatches, and the run described with the full order."""
    split = run.plan.pipeline
    assert split is not None
    if step.numbering.microbatches == split.microbatches:
        return places(step), step
    full = rank_actions(split, pp_rank)
    numbering = Numbering(step.numbering.local_stages, split.microbatches, len(full))
    expanded = expand_microbatches(step, full, numbering, simulated_micro_steps(run))
    return expanded, dataclasses.replace(step, actions=full, numbering=numbering)


def rank_estimate(run: ResolvedRun, pp_rank: int, rank: int, runs: list[RankStep]) -> tuple[RankEstimate, str, RankStep]:
    """The estimate for the ranks at pipeline coordinate `pp_rank` from its one or two simulations."""
    split = run.plan.pipeline
    assert split is not None
    counts = stage_block_counts(split, run.plan.layout.blocks)
    local = split.local_stages(pp_rank)
    read = [rank_places(run, pp_rank, step) for step in runs]
    reference = read[-1][1]
    if len(runs) == 1:
        peaks = read[0][0]
        method = "fake tensors, every block of each stage"
    else:
        steps = min(counts[s] for s in local) - MIN_UNITS
        peaks = extrapolate(read[0][0], read[1][0], steps)
        method = f"fake tensors, stages {steps} and {steps - 1} blocks shorter, extrapolated"
    if reference is not runs[-1]:
        method += f", {REDUCED_MICROBATCHES} microbatches extended to {split.microbatches}"
    place, peak = max(peaks.items(), key=lambda kv: kv[1].total)
    first = local[0]
    modules = activations_by_module(reference.step, run.plan, max(reference.counts[first], 1), counts[first])
    per_stage = run.dims.world_size // run.dims.pp
    ranks = f"rank {rank}" if per_stage == 1 else f"ranks {rank}-{rank + per_stage - 1}"
    stages = " and ".join(str(s) for s in local)
    estimate = RankEstimate(
        ranks=f"pipeline rank {pp_rank}, stage{'s' if len(local) > 1 else ''} {stages} ({ranks})",
        simulated_rank=reference.simulated_rank, peak=peak, peak_at=describe_place(place, reference, split.n_stages - 1),
        phase_peaks=phase_peaks(peaks), activations=modules,
    )
    return estimate, method, reference


def pipeline_notes(run: ResolvedRun, steps: list[RankStep]) -> list[str]:
    split = run.plan.pipeline
    assert split is not None
    t = run.cfg.training
    flight = {s: n for step in steps for s, n in max_in_flight(step.actions).items()}
    shape = f"{t.local_batch_size // split.microbatches} x {t.seq_len}"
    if run.dims.cp > 1:
        shape += f" ({t.seq_len // run.dims.cp} tokens of each sequence per cp rank)"
    notes = [
        f"pipeline {split.schedule}: {split.n_stages} stages, {split.microbatches} microbatches of "
        f"{shape} per schedule step; microbatches in flight at most "
        + ", ".join(f"stage {s}: {flight[s]}" for s in sorted(flight)),
        ("pipeline: receive buffers, one per microbatch, are in temporaries; a tensor being sent is counted until "
         "its action ends"),
    ]
    if data_parallel_kind(run) == "zero1":
        notes.append("zero1: optimizer state is that of data-parallel rank 0's partition of each stage")
    return notes


def estimate_pipeline_run(run: ResolvedRun, gpu_memory_gib: float, full_depth: bool = False) -> MemoryReport:
    """The report of a pipeline-parallel run: one rank class per pipeline rank (see estimate_run)."""
    start = time.perf_counter()
    split = run.plan.pipeline
    assert split is not None
    classes = rank_classes(run.dims)  # one per pp coordinate, in order
    plans = [simulations(run, pp_rank, c.rank, full_depth) for pp_rank, c in enumerate(classes)]
    ranks, methods, steps = [], set(), []
    for pp_rank, (rank_class, rank_steps) in enumerate(zip(classes, simulate_all(run, plans))):
        estimate, method, reference = rank_estimate(run, pp_rank, rank_class.rank, rank_steps)
        ranks.append(estimate)
        methods.add(method)
        steps.append(reference)
    settings = describe_settings(run)
    settings["loss"] = "plain, per microbatch on the last stage"
    settings["pipeline"] = f"{split.schedule} x {split.microbatches} microbatches"
    parameter_count = sum(p.numel() for p in meta_model(run).parameters())
    return MemoryReport(
        model=describe_model(run, parameter_count), ngpu=run.dims.world_size, layout=run.dims.degrees(), settings=settings,
        ranks=ranks, gpu_memory_gib=gpu_memory_gib, method="; ".join(sorted(methods)),
        notes=ignored_features(run) + context_notes(run) + pipeline_notes(run, steps), elapsed_s=time.perf_counter() - start,
    )

