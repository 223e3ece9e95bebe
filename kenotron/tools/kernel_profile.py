"""Where a training step's GPU time goes: device kernels grouped by kind.

`bench.py --profile` runs a few extra steps under torch.profiler and prints the top kernels and
this summary: the device time of each kind of kernel per step, what share of the step's wall
time the GPU was busy, and therefore how much time no kernel ran (launch overhead, host
synchronisation). Kinds are read from the kernel names of cuBLAS, cuDNN, NCCL, Triton
(compiled code) and PyTorch's own kernels.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType

# First match wins: attention before matmul (cuDNN's attention kernels contain "gemm"-like
# substrings in some builds), the optimizer before generic elementwise.
KERNEL_KINDS: list[tuple[str, re.Pattern]] = [
    ("attention", re.compile(r"fmha|flash|sdpa|attention|attn", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_|ampere_|splitk", re.IGNORECASE)),
    ("optimizer", re.compile(r"adam|fused_sgd", re.IGNORECASE)),
    ("communication", re.compile(r"nccl", re.IGNORECASE)),
    ("compiled (triton)", re.compile(r"^triton_", re.IGNORECASE)),
    ("norm / multi-tensor", re.compile(r"multi_tensor|foreach|norm", re.IGNORECASE)),
    ("copy / cast", re.compile(r"copy|cast|convert|memcpy|memset|fill", re.IGNORECASE)),
]
OTHER = "other (aten elementwise, reductions)"


def kernel_kind(name: str) -> str:
    for kind, pattern in KERNEL_KINDS:
        if pattern.search(name):
            return kind
    return OTHER


@dataclass
class KernelSummary:
    """Device microseconds per kernel kind, summed over the profiled steps."""

    steps: int
    wall_us: float
    by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def busy_us(self) -> float:
        return sum(self.by_kind.values())

    def table(self) -> str:
        per_step = self.wall_us / self.steps
        lines = [
            (f"GPU time per step by kernel kind (step wall {per_step / 1e3:.1f} ms, GPU busy "
             f"{100 * self.busy_us / self.wall_us:.1f}%; kernels on several streams can overlap)"),
            "| kind | ms / step | share of wall |",
            "|---|---|---|",
        ]
        for kind, us in sorted(self.by_kind.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {kind} | {us / self.steps / 1e3:.2f} | {100 * us / self.wall_us:.1f}% |")
        idle = max(self.wall_us - self.busy_us, 0.0)
        lines.append(f"| (no kernel running) | {idle / self.steps / 1e3:.2f} | {100 * idle / self.wall_us:.1f}% |")
        return "\n".join(lines)


def summarize_kernels(kernels: list[tuple[str, float]], steps: int, wall_us: float) -> KernelSummary:
    """kernels: (name, device microseconds) of every kernel launch in the profiled window."""
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        by_kind[kernel_kind(name)] += us
    return KernelSummary(steps=steps, wall_us=wall_us, by_kind=dict(by_kind))


def device_kernels(prof) -> list[tuple[str, float]]:
    """(name, device us) of the device-side kernel events of a finished torch.profiler run."""
    out = []
    for evt in prof.events():
        # Ranges such as "Optimizer.step#AdamW.step" also appear on the device timeline
        # (user annotations spanning the kernels inside): counting them would count twice.
        if evt.device_type == DeviceType.CUDA and not getattr(evt, "is_user_annotation", False):
            out.append((evt.name, float(evt.device_time_total)))
    return out


def top_kernels(kernels: list[tuple[str, float]], steps: int, n: int = 60) -> list[dict]:
    """The n kernels with the most device time: name, kind, calls and ms per step."""
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, us in kernels:
        total[name][0] += us
        total[name][1] += 1
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {"name": name, "kind": kernel_kind(name), "calls_per_step": calls / steps, "ms_per_step": us / steps / 1e3}
        for name, (us, calls) in rows
    ]


def median_cuda_ms(fn, reps: int = 20, warmup: int = 5) -> float:
    """Median device time of `fn()` in ms over `reps` calls after `warmup` (CUDA events around
    each call): how the scripts/bench_*.py microbenchmarks time one kernel or one step alone."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
