"""The link's bandwidth, measured: each collective of a training step timed alone.

    torchrun --nproc-per-node 2 scripts/bench_collectives.py                  # NVLink
    NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 scripts/bench_collectives.py  # through host memory

Every rank runs all-gather, reduce-scatter, all-reduce and all-to-all on buffers of each size
(bf16 and fp32), `reps` times after `warmup`, and rank 0 prints one table: the median time and
the bus bandwidth, NCCL's measure of what each link carries, so that one number describes the
link whatever the collective and the world size:

    algorithm bandwidth = bytes / time   (bytes: the whole buffer, the gathered or reduced one)
    bus bandwidth       = algorithm bandwidth x factor,  factor = 2(n-1)/n for all-reduce,
                          (n-1)/n for all-gather, reduce-scatter and all-to-all

The GPU rows of docs/performance.md state the link they ran on with this table; the throughput
model prices a collective as bytes x factor / bus bandwidth (docs/estimation.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")


def bus_factor(collective: str, world: int) -> float:
    """What each link carries per byte of the whole buffer (NCCL's busbw factor)."""
    if collective == "all-reduce":
        return 2 * (world - 1) / world
    return (world - 1) / world


@dataclass
class CollectiveTiming:
    collective: str
    dtype: str
    mib: float
    """Size of the whole buffer (the gathered, reduced or exchanged one), MiB."""
    ms: float
    """Median time of one call."""
    world: int

    @property
    def bus_gb_s(self) -> float:
        return self.mib * 2**20 * bus_factor(self.collective, self.world) / (self.ms / 1e3) / 1e9


def _call(collective: str, full: torch.Tensor, shard: torch.Tensor, group=None):
    if collective == "all-gather":
        return lambda: dist.all_gather_into_tensor(full, shard, group=group)
    if collective == "reduce-scatter":
        return lambda: dist.reduce_scatter_tensor(shard, full, group=group)
    if collective == "all-reduce":
        return lambda: dist.all_reduce(full, group=group)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full, group=group)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_collective(collective: str, mib: float, dtype: torch.dtype, device: torch.device, reps: int = 10,
                    warmup: int = 3) -> CollectiveTiming:
    """Median time of `collective` on a whole buffer of `mib` MiB (every rank of the default group)."""
    world = dist.get_world_size()
    elements = int(mib * 2**20) // torch.empty((), dtype=dtype).element_size() // world * world
    full = torch.ones(elements, dtype=dtype, device=device)
    shard = torch.ones(elements // world, dtype=dtype, device=device)
    run = _call(collective, full, shard)
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        run()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    # Every rank reports the slowest rank's time: a collective ends when its last rank is done.
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)  # NCCL: device tensors only
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return CollectiveTiming(collective, str(dtype).removeprefix("torch."), elements * full.element_size() / 2**20,
                            float(slowest.item()), world)


def table(rows: list[CollectiveTiming]) -> str:
    lines = [f"Collectives over {rows[0].world} ranks (median of each call; bus bandwidth as NCCL's tests report it)",
             "| collective | dtype | MiB | ms | bus GB/s |", "|---|---|---|---|---|"]
    lines += [f"| {r.collective} | {r.dtype} | {r.mib:.0f} | {r.ms:.3f} | {r.bus_gb_s:.1f} |" for r in rows]
    return "\n".join(lines)


def measure(sizes_mib: list[float], dtypes: list[torch.dtype], device: torch.device, reps: int = 10
            ) -> list[CollectiveTiming]:
    return [time_collective(c, mib, dtype, device, reps) for c in COLLECTIVES for dtype in dtypes for mib in sizes_mib]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="time each collective alone and print the link's bus bandwidth")
    parser.add_argument("--mib", type=float, nargs="+", default=[64.0, 512.0], help="whole-buffer sizes, MiB")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    try:
        rows = measure(args.mib, [torch.bfloat16, torch.float32] if cuda else [torch.float32], device, args.reps)
        if dist.get_rank() == 0:
            print(table(rows), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
