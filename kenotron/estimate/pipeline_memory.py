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

One rank's tracked step and the positions its memory is read at: pipeline_rank_step.py; here,
which fake runs estimate each pipeline rank, and the report.

The planner's closed form prices the pipeline ranks of every schedule from the same orders
(kenotron/planner/analytic_pipeline.py), and its search enumerates them.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

from kenotron.estimate.breakdown import Breakdown
from kenotron.estimate.cp_ring_memory import context_notes
from kenotron.estimate.depth import activations_by_module
from kenotron.estimate.fake_job import ignored_features, simulated_micro_steps
from kenotron.estimate.pipeline_order import REDUCED_MICROBATCHES, max_in_flight, rank_actions
from kenotron.estimate.pipeline_rank_step import (
    Place,
    RankStep,
    describe_place,
    expand_microbatches,
    extrapolate,
    places,
    track_pipeline_step,
)
from kenotron.estimate.pipeline_replay import Numbering, resized_split, stage_block_counts, with_microbatches
from kenotron.estimate.rank_classes import rank_classes
from kenotron.estimate.report import MemoryReport, RankEstimate, describe_model, describe_settings, phase_peaks
from kenotron.estimate.static_memory import data_parallel_kind, meta_model
from kenotron.parallel.pipeline import SINGLE_STAGE_SCHEDULES
from kenotron.train.resolve import ResolvedRun

MIN_UNITS = 3
"""Blocks of the smallest stage in the shallower copy: its first and last blocks and one plain
block between them, named both second and penultimate (`places`), so that both shallow runs have
the four places of a deep stage (depth.py gets them from four and five blocks, naming each once)."""


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

