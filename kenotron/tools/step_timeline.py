"""Where a multi-GPU step's time goes: compute, each collective, and how much of each is exposed.

`bench.py --timeline DIR` profiles a few extra steps on every rank, writes each rank's trace
(Chrome trace format, gzipped) into DIR and prints this analysis of rank 0's and the last
rank's. It reads only the trace's device and runtime events, so a saved trace can be analysed
again elsewhere: `python -m kenotron.tools.step_timeline TRACE.json.gz`.

Per step (averaged over the traced steps):
- compute: the union of the kernels that are not collectives, on any stream;
- each kind of collective (all-gather, reduce-scatter, all-reduce, all-to-all / send-recv,
  broadcast): its device time, and its *exposed* time, during which it runs and no compute
  kernel does. Exposed time is what the step loses to communication; the rest is hidden;
- idle: no kernel at all runs (the host is late: launches, host synchronizations);
- the head (from the step's first kernel to its first matmul: the first all-gathers and
  whatever waits on them) and the tail (from the last matmul before the optimizer to the
  optimizer's first kernel: the last reduce-scatters or all-reduces), each with its exposed
  communication;
- the optimizer: the device span of `Optimizer.step` ranges;
- FSDP's copies into and out of the collectives' buffers (foreach copies, chunk_cat,
  split_with_sizes_copy), which run on the compute or the all-gather stream;
- host synchronizations (stream, event and device synchronizes, synchronous memcpys: an
  `.item()` or `.tolist()` shows here) and stream waits (`cudaStreamWaitEvent`), counted.

A step is the span of a `kenotron_step` range (bench.py puts one around each traced step): on
the device, from its start to the next step's; runtime calls count in its host-side range.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

STEP_RANGE = "kenotron_step"
"""The name of the record_function range around each traced step."""

COLLECTIVES: list[tuple[str, re.Pattern]] = [
    ("all-gather", re.compile(r"allgather|all_gather", re.IGNORECASE)),
    ("reduce-scatter", re.compile(r"reducescatter|reduce_scatter", re.IGNORECASE)),
    ("all-reduce", re.compile(r"allreduce|all_reduce", re.IGNORECASE)),
    ("all-to-all / send-recv", re.compile(r"sendrecv|alltoall|all_to_all|send|recv", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
]
NCCL = re.compile(r"nccl", re.IGNORECASE)
MATMUL = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_xmma|wgmma", re.IGNORECASE)
FSDP_COPY = re.compile(r"CopyFunctor|foreach_copy|chunk_cat|split_with_sizes", re.IGNORECASE)
HOST_SYNC = re.compile(r"^cuda(StreamSynchronize|EventSynchronize|DeviceSynchronize|Memcpy)$")
STREAM_WAIT = "cudaStreamWaitEvent"
HOST_BLOCK_US = 500.0
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}

Interval = tuple[float, float]


def collective_kind(name: str) -> str | None:
    """The collective a device kernel runs, or None when it is not a collective."""
    if not NCCL.search(name):
        return None
    for kind, pattern in COLLECTIVES:
        if pattern.search(name):
            return kind
    return "other collective"


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The points of `a` not in `b` (both made disjoint first)."""
    out: list[Interval] = []
    b = union(b)
    for start, end in union(a):
        cursor = start
        for bs, be in b:
            if be <= cursor or bs >= end:
                continue
            if bs > cursor:
                out.append((cursor, bs))
            cursor = max(cursor, be)
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(intervals: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


@dataclass
class StepTimeline:
    """Microseconds per step, averaged over the traced steps of one rank."""

    steps: int
    wall: float = 0.0
    compute: float = 0.0
    idle: float = 0.0
    optimizer: float = 0.0
    fsdp_copies: float = 0.0
    head: float = 0.0
    head_exposed: float = 0.0
    tail: float = 0.0
    tail_exposed: float = 0.0
    collective: dict[str, float] = field(default_factory=dict)
    exposed: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    host_syncs: float = 0.0
    host_sync_us: float = 0.0
    stream_waits: float = 0.0

    def table(self, label: str = "") -> str:
        ms = 1e-3
        lines = [
            (f"Step timeline{(' ' + label) if label else ''}: wall {self.wall * ms:.1f} ms per step over "
             f"{self.steps} steps (exposed = running while no compute kernel runs)"),
            "| part | ms / step | exposed ms / step | calls / step |",
            "|---|---|---|---|",
            f"| compute (all streams) | {self.compute * ms:.2f} | | |",
        ]
        for kind in sorted(self.collective, key=lambda k: -self.collective[k]):
            lines.append(f"| {kind} | {self.collective[kind] * ms:.2f} | {self.exposed.get(kind, 0.0) * ms:.2f} | "
                         f"{self.calls.get(kind, 0.0):.0f} |")
        lines += [
            f"| idle (no kernel) | {self.idle * ms:.2f} | {self.idle * ms:.2f} | |",
            f"| head: first kernel to first matmul | {self.head * ms:.2f} | {self.head_exposed * ms:.2f} | |",
            f"| tail: last matmul to optimizer | {self.tail * ms:.2f} | {self.tail_exposed * ms:.2f} | |",
            f"| optimizer (device span) | {self.optimizer * ms:.2f} | | |",
            f"| FSDP buffer copies | {self.fsdp_copies * ms:.2f} | | |",
            f"| host synchronizations | {self.host_sync_us * ms:.2f} (host) | | {self.host_syncs:.0f} |",
            f"| stream waits | | | {self.stream_waits:.0f} |",
        ]
        return "\n".join(lines)


def _step_spans(events: list[dict], device: list[dict]) -> tuple[list[Interval], list[Interval]]:
    """(device spans, host spans) of the traced steps.

    The profiler's device-side range of a step ends before kernels launched inside nested
    ranges (the optimizer's), so a step's device span runs from its range's start to the next
    step's (the last one to the trace's last kernel). Without device-side ranges (a CPU run),
    the host-side ranges serve for both. A step whose kernels ran on several streams has a
    device-side range on each, all with the host range's "External id": the step starts at the
    first of them."""
    host = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "user_annotation" and e.get("name") == STEP_RANGE and "dur" in e)
    first: dict[object, float] = {}
    for e in events:
        if e.get("cat") == "gpu_user_annotation" and e.get("name") == STEP_RANGE and "dur" in e:
            step = (e.get("args") or {}).get("External id", id(e))
            first[step] = min(first.get(step, e["ts"]), e["ts"])
    starts = sorted(first.values())
    if not starts:
        return host, host
    end = max((e["ts"] + e["dur"] for e in device), default=starts[-1])
    return [(a, b) for a, b in zip(starts, [*starts[1:], end])], host


def analyse(trace: dict) -> StepTimeline:
    """The per-step breakdown of one rank's Chrome trace (torch.profiler's export)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e]
    steps, host_steps = _step_spans(events, device)
    if not steps:
        raise ValueError(f"the trace has no '{STEP_RANGE}' range: profile the steps inside record_function('{STEP_RANGE}')")
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e]
    optimizer_spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("Optimizer.step")]
    out = StepTimeline(steps=len(steps))
    collective_sum: dict[str, float] = defaultdict(float)
    exposed_sum: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    for (lo, hi), (host_lo, host_hi) in zip(steps, host_steps, strict=False):
        inside = [e for e in device if e["ts"] < hi and e["ts"] + e["dur"] > lo]
        by_kind: dict[str, list[Interval]] = defaultdict(list)
        compute: list[Interval] = []
        matmuls: list[Interval] = []
        copies: list[Interval] = []
        for e in inside:
            span = (max(e["ts"], lo), min(e["ts"] + e["dur"], hi))
            kind = collective_kind(e["name"])
            if kind is None:
                compute.append(span)
                if MATMUL.search(e["name"]):
                    matmuls.append(span)
                if FSDP_COPY.search(e["name"]):
                    copies.append(span)
            else:
                by_kind[kind].append(span)
                calls[kind] += 1
        everything = compute + [s for spans in by_kind.values() for s in spans]
        out.wall += hi - lo
        out.compute += length(compute)
        out.idle += (hi - lo) - length(everything)
        out.fsdp_copies += length(copies)
        for kind, spans in by_kind.items():
            collective_sum[kind] += length(spans)
            exposed_sum[kind] += length(minus(spans, compute))
        comm = [s for spans in by_kind.values() for s in spans]
        optimizer = union(clip(optimizer_spans, lo, hi))
        out.optimizer += length(optimizer)
        if everything and matmuls:
            first_kernel = min(s for s, _ in everything)
            first_matmul = min(s for s, _ in matmuls)
            out.head += first_matmul - first_kernel
            out.head_exposed += length(minus(clip(comm, first_kernel, first_matmul), compute))
            end = optimizer[0][0] if optimizer else hi
            before = [e for _, e in matmuls if e <= end]
            if before:
                last_matmul = max(before)
                out.tail += end - last_matmul
                out.tail_exposed += length(minus(clip(comm, last_matmul, end), compute))
        for e in runtime:
            if host_lo <= e["ts"] < host_hi:  # host calls: the step's host-side range
                # A runtime call that blocks the host for long (a device-to-host copy waits for the
                # stream) is a synchronization whatever its name.
                if HOST_SYNC.match(e["name"]) or e["dur"] > HOST_BLOCK_US:
                    out.host_syncs += 1
                    out.host_sync_us += e["dur"]
                elif e["name"] == STREAM_WAIT:
                    out.stream_waits += 1
    n = len(steps)
    for name in ("wall", "compute", "idle", "optimizer", "fsdp_copies", "head", "head_exposed", "tail",
                 "tail_exposed", "host_syncs", "host_sync_us", "stream_waits"):
        setattr(out, name, getattr(out, name) / n)
    out.collective = {k: v / n for k, v in collective_sum.items()}
    out.exposed = {k: v / n for k, v in exposed_sum.items()}
    out.calls = {k: v / n for k, v in calls.items()}
    return out


def read_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m kenotron.tools.step_timeline TRACE.json[.gz] [...]", file=sys.stderr)
        return 2
    for path in paths:
        print(analyse(read_trace(path)).table(Path(path).name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
