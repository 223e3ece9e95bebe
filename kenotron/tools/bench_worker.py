"""One benchmark case inside its own process (every rank): build the real trainer, time its
steps, write the row's numbers as JSON (kenotron/tools/bench.py starts it, through torchrun for
several GPUs, and reads the file back).

    python -m kenotron.tools.bench_worker --out OUT.json --warmup 3 --steps 7 --timing stream -- --config X.toml ...

The benchmark's parent process only starts these and never imports torch; this module is the
part that does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from kenotron.config import load_config, split_config_arg
from kenotron.parallel.model_layout import matching_modules
from kenotron.runtime.distributed import WorldInfo
from kenotron.tools.bench import SYNTHETIC
from kenotron.tools.block_trace import BlockTimer, format_trace, stream_pools
from kenotron.tools.kernel_profile import device_kernels, summarize_kernels, top_kernels
from kenotron.tools.step_timeline import STEP_RANGE, analyse, read_trace
from kenotron.train.step import clip_gradients, forward_backward
from kenotron.train.trainer import Trainer, setup_logging


@contextmanager
def profiled_together(device: torch.device) -> Iterator[profile]:
    """The profiler, entered by every rank, whose traced steps then start on every rank at once.
    Ranks reach the profiler at their own times (the analysis of the report before takes each rank
    its own time) and its start costs each its own; without the barrier inside, the traced steps'
    first collective waits for the last rank and counts as exposed communication (a 147 ms
    all-gather in a 189 ms step, docs/performance.md)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        if dist.is_initialized():
            dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
        sync()
        yield prof


def _profile(trainer, steps: int = 3, rows: int = 30) -> tuple[str, list[dict]]:
    """Top ops by device time, the time per kernel kind, and the top kernels, over `steps` extra steps."""
    with profiled_together(trainer.device) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.run_step(trainer.loader.next_step())
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    averages = prof.key_averages()
    top = averages.table(sort_by="device_time_total", row_limit=rows, max_name_column_width=90)
    # Host time in CUDA runtime calls: a synchronizing call (a stream or event wait, a pinned
    # allocation) shows here as milliseconds during which the host queues no work.
    runtime = sorted((e for e in averages if e.key.startswith("cuda")), key=lambda e: -e.cpu_time_total)[:8]
    host = "CUDA runtime calls, host ms per step: " + ", ".join(
        f"{e.key} {e.cpu_time_total / 1e3 / steps:.1f} ({e.count // steps}x)" for e in runtime)
    kernels = device_kernels(prof)
    return top + "\n" + host + "\n" + summarize_kernels(kernels, steps, wall_us).table(), top_kernels(kernels, steps)


def _timeline(trainer, folder: str, steps: int = 3) -> str:
    """Profile `steps` more steps on every rank, write each rank's trace into `folder`
    (rank{r}.json.gz) and return step_timeline's tables of rank 0's and the last rank's."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    Path(folder).mkdir(parents=True, exist_ok=True)
    with profiled_together(trainer.device) as prof:
        for _ in range(steps):
            with record_function(STEP_RANGE):
                trainer.run_step(trainer.loader.next_step())
        torch.cuda.synchronize()
    raw = Path(folder) / f"rank{rank}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        return ""
    ranks = sorted({0, world - 1})
    return "\n".join(analyse(read_trace(Path(folder) / f"rank{r}.json.gz")).table(f"rank {r}") for r in ranks)


def _trace(trainer) -> str:
    """Per-block times of one more step and the allocator's pools by stream (block_trace.py)."""
    blocks = [m for _, m in matching_modules(trainer.job.model_parts[0], trainer.run.plan.layout.blocks)]
    timer = BlockTimer(blocks, trainer.device)
    try:
        trainer.run_step(trainer.loader.next_step())
        forward, tail, backward = timer.times()
    finally:
        timer.close()
    return format_trace(forward, tail, backward, stream_pools(trainer.device))


def time_steps(trainer, warmup: int, steps: int, timing: str) -> tuple[list[float], list]:
    """Seconds of each timed step, and the loss tensor of every step (warm-up included)."""
    cuda = trainer.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = []
    for _ in range(warmup):
        losses.append(trainer.run_step(trainer.loader.next_step())[0])
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(trainer.device)
    times: list[float] = []
    if timing == "stream" and cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        for i in range(steps):
            starts[i].record()
            losses.append(trainer.run_step(trainer.loader.next_step())[0])
        starts[steps].record()
        sync()
        times = [starts[i].elapsed_time(starts[i + 1]) / 1e3 for i in range(steps)]
    else:
        for _ in range(steps):
            batch = trainer.loader.next_step()
            sync()
            t0 = time.perf_counter()
            losses.append(trainer.run_step(batch)[0])
            sync()
            times.append(time.perf_counter() - t0)
    return times, losses


def optimizer_ms(trainer, repeats: int = 5) -> float:
    """Milliseconds of one optimizer step (every model part's optimizer, as the step runs them;
    the median of `repeats` on the gradients of one more forward and backward), synchronized
    around each: the optimizer's own time, without the early all-gather's overlap."""
    job = trainer.job
    forward_backward(job, trainer.loader.next_step())
    clip_gradients(job)
    cuda = trainer.device.type == "cuda"
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier()
        t0 = time.perf_counter()
        for optimizer in job.optimizers:
            optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    for optimizer in job.optimizers:
        optimizer.zero_grad(set_to_none=True)
    return statistics.median(times)


def run_worker(out_path: str, warmup: int, steps: int, overrides: list[str], profile: bool = False,
               timing: str = "stream", trace: bool = False, timeline: str | None = None,
               optimizer: bool = False) -> None:
    """Inside one case's process (every rank): build the trainer, time the steps, write JSON."""
    world = WorldInfo.from_env()
    setup_logging(world.rank)
    path, rest = split_config_arg(overrides)
    cfg = load_config(path, SYNTHETIC + rest + ["--training.steps", str(warmup + steps)])
    trainer = Trainer(cfg)  # as the rank program of `kenotron train`
    device = trainer.device
    tokens = trainer.run.global_batch_size * cfg.training.seq_len
    times, loss_tensors = time_steps(trainer, warmup, steps, timing)
    losses = trainer.global_losses(loss_tensors).tolist()
    step_time = statistics.median(times)
    tps = tokens / step_time / world.world_size
    peak = trainer.metrics._peak
    allocated = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    reserved = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else 0.0
    if dist.is_initialized():
        mem = torch.tensor([allocated, reserved], device=device)
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        allocated, reserved = mem.tolist()
    result = {
        "tokens_per_sec": tps,
        "tflops": tps * trainer.flops_per_token / 1e12,
        "mfu": 100 * tps * trainer.flops_per_token / peak if peak else None,
        "memory_allocated_gib": allocated,
        "memory_reserved_gib": reserved,
        "step_time_s": step_time,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "world_size": world.world_size,
        "timing": timing,
        "device": trainer.metrics.device_name,
        "torch": torch.__version__,
    }
    if optimizer:  # the optimizer step's share of the step (issue 37: Muon beside AdamW)
        result["optimizer_ms"] = optimizer_ms(trainer)
        result["optimizer_share"] = result["optimizer_ms"] / 1e3 / step_time
    if profile and device.type == "cuda":
        result["profile"], result["kernels"] = _profile(trainer)
    if trace:
        result["trace"] = _trace(trainer)
    if timeline and device.type == "cuda":
        result["timeline"] = _timeline(trainer, timeline)
    if world.rank == 0:
        Path(out_path).write_text(json.dumps(result))
    trainer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one kenotron benchmark case (started by kenotron/tools/bench.py)")
    parser.add_argument("--out", required=True, help="file the case's numbers are written to (JSON, by rank 0)")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--timing", choices=["stream", "sync"], default="stream")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--timeline", metavar="DIR")
    parser.add_argument("--optimizer", action="store_true")
    args, rest = parser.parse_known_args(argv)
    run_worker(args.out, args.warmup, args.steps, [a for a in rest if a != "--"], args.profile, args.timing,
               args.trace, args.timeline, args.optimizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
