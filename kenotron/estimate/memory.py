"""estimate_memory: a config and a GPU count in, per-rank peak memory out, without GPUs.

For each group of ranks that hold the same things (all ranks; under pipeline parallel one
per pipeline rank, simulated in its schedule's order by pipeline_memory.py) one rank is simulated: a
fake process group of the job's world size in which this process is that rank, the trainer's
job built on fake tensors (fake_job.py), one warm-up step (which creates the optimizer state
and FSDP's lazily allocated buffers, as a real first step does), then one tracked step
(tracker.py). Deep models are not run whole: two shallow copies give the line that memory
follows with depth (depth.py), which keeps every estimate to seconds and a few hundred MB.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from kenotron.config import JobConfig
from kenotron.estimate.breakdown import TrackedStep
from kenotron.estimate.cp_ring_memory import context_notes, torch_cp_state
from kenotron.estimate.cuda_kernels import cuda_kernel_memory
from kenotron.estimate.depth import (
    activations_by_module,
    block_period,
    extrapolate_peaks,
    peaks_by_place,
    shallow_depths,
)
from kenotron.estimate.fake_job import (
    DeviceBatches,
    build_fake_job,
    estimated_run,
    fake_process_group,
    ignored_features,
    simulated_micro_steps,
)
from kenotron.estimate.fake_tensor_recorder import FakeTensorRecorder
from kenotron.estimate.pipeline_memory import estimate_pipeline_run
from kenotron.estimate.rank_classes import RankClass, rank_classes
from kenotron.estimate.report import MemoryReport, RankEstimate, describe_model, describe_settings, phase_peaks
from kenotron.estimate.static_memory import data_parallel_kind, meta_model, zero1_correction
from kenotron.estimate.tracker import StepMemoryTracker
from kenotron.parallel.model_layout import matching_modules
from kenotron.train.resolve import ResolvedRun, resolve_run
from kenotron.train.step import train_step

DEFAULT_GPU_MEMORY_GIB = 80.0
"""Budget when none is given and no GPU is visible (an 80 GB H100 / A100)."""


def default_gpu_memory_gib() -> float:
    """The visible GPU's memory, else DEFAULT_GPU_MEMORY_GIB."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return DEFAULT_GPU_MEMORY_GIB


def track_step(run: ResolvedRun, n_layers: int | None, rank: int) -> TrackedStep:
    """Build the job on fake tensors as `rank`, run a warm-up step, then track one step."""
    run = estimated_run(run, n_layers)
    batches = DeviceBatches(run, simulated_micro_steps(run))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_process_group(run.dims.world_size, rank), cuda_kernel_memory(), torch_cp_state():
        # What the build and the warm-up make, for the state libraries keep (register_other_live_tensors).
        with FakeTensorRecorder(mode) as made:
            job = build_fake_job(run, mode)
            with mode:
                train_step(job, batches)
        with mode:
            tracker = StepMemoryTracker(job.model, job.blocks())
            tracker.register_static([*job.model.parameters(), *job.model.buffers()], "parameters")
            tracker.register_static(job.optimizer_state(), "optimizer_state")
            tracker.register_other_live_tensors("parameters", made.alive())
            for offloader in job.applied.offloaders:  # prefetch by the tracked memory, as on a GPU
                offloader.memory_in_use = tracker.live_bytes
            with tracker:
                train_step(job, batches, tracker)
    return tracker.result()


def estimate_rank(
    run: ResolvedRun, rank_class: RankClass, model: nn.Module, full_depth: bool = False
) -> tuple[RankEstimate, str]:
    """One rank class's estimate and how it was obtained (`model`: the run's model on meta)."""
    n_layers = run.model_args.n_layers
    period = block_period(run.plan)
    # Offloading makes the first blocks unlike the others, as a hybrid's attention blocks are unlike
    # its Mamba blocks: the line through two shallow models would not hold, so every block runs.
    mixed = len({type(m) for _, m in matching_modules(model, run.plan.layout.blocks)}) > 1
    depths = None if full_depth or mixed or run.plan.settings.offload_blocks else shallow_depths(n_layers, period)
    if depths is None:
        step = track_step(run, None, rank_class.rank)
        peaks = peaks_by_place(step, n_layers, period)
        modules = activations_by_module(step, run.plan, n_layers, n_layers)
        method = f"fake tensors, all {n_layers} blocks"
    else:
        shallow = (track_step(run, depths[0], rank_class.rank), track_step(run, depths[1], rank_class.rank))
        peaks = extrapolate_peaks(shallow, depths, n_layers, period)
        modules = activations_by_module(shallow[1], run.plan, depths[1], n_layers)
        method = f"fake tensors, {depths[0]} and {depths[1]} blocks extrapolated to {n_layers}"
    start = [b.optimizer_state for place, b in peaks.items() if place.phase == "start"]
    correction = zero1_correction(run, model, start[0] if start else 0)
    if correction:
        peaks = {p: dataclasses.replace(b, optimizer_state=b.optimizer_state + correction) for p, b in peaks.items()}
    place, peak = max(peaks.items(), key=lambda kv: kv[1].total)
    estimate = RankEstimate(
        ranks=rank_class.description, simulated_rank=rank_class.rank, peak=peak, peak_at=place.describe(),
        phase_peaks=phase_peaks(peaks), activations=modules,
    )
    return estimate, method


def estimate_run(run: ResolvedRun, gpu_memory_gib: float | None = None, full_depth: bool = False) -> MemoryReport:
    """The report for a resolved run (see estimate_memory)."""
    start = time.perf_counter()
    if run.dims.pp > 1:
        # Each pipeline rank runs its own stages in its own order: simulated one by one (pipeline_memory.py).
        budget = gpu_memory_gib if gpu_memory_gib is not None else default_gpu_memory_gib()
        return estimate_pipeline_run(run, budget, full_depth)
    model = meta_model(run)
    ranks, methods = [], set()
    for rank_class in rank_classes(run.dims):
        estimate, method = estimate_rank(run, rank_class, model, full_depth)
        ranks.append(estimate)
        methods.add(method)
    notes = ignored_features(run) + context_notes(run)
    if data_parallel_kind(run) == "zero1":
        notes.append("zero1: optimizer state is that of the rank owning the most parameters (from the partition)")
    return MemoryReport(
        model=describe_model(run, sum(p.numel() for p in model.parameters())),
        ngpu=run.dims.world_size, layout=run.dims.degrees(), settings=describe_settings(run), ranks=ranks,
        gpu_memory_gib=gpu_memory_gib if gpu_memory_gib is not None else default_gpu_memory_gib(),
        method="; ".join(sorted(methods)), notes=notes, elapsed_s=time.perf_counter() - start,
    )


def estimate_memory(
    cfg: JobConfig, ngpu: int, gpu_memory_gib: float | None = None, full_depth: bool = False
) -> MemoryReport:
    """Per-rank peak memory of `cfg` trained on `ngpu` GPUs.

    The config is checked by the trainer's own `resolve_run`, so a bad config raises the
    same error the trainer would. `full_depth` runs every block instead of extrapolating
    from two shallow copies (slower; for checking the extrapolation).
    """
    return estimate_run(resolve_run(cfg, ngpu, check_data=False), gpu_memory_gib, full_depth)
