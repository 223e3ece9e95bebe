"""`bench.py --trace`: where a step's time and memory go, block by block.

- Per-block times: a stamp when each block's forward begins and when its backward begins (a
  hook on its output's gradient), on the compute stream (CUDA events; wall-clock stamps on a
  CPU, where ops run in order). A block that waits (for a copy, an all-gather, the host) shows
  as one long entry among equal ones, which a profile's per-kernel totals hide: this is how the
  offloader's copies queuing ahead of FSDP's copy-out were found (docs/performance.md).
- Memory by stream: the caching allocator keeps a pool per stream, and memory freed in one
  stream's pool is not reused by another's, so reserved memory above the allocated peak is
  often a side stream's pool (the gradients were once found in the reduce-scatter stream's).

The hooks go on the blocks after everything else (compile, FSDP, offloading), are
Dynamo-disabled like theirs, and are removed by `close`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class _Pass:
    forward: list[tuple[int, object]] = field(default_factory=list)
    backward: list[tuple[int, object]] = field(default_factory=list)


class BlockTimer:
    """Stamps at each block's forward and backward start; `times()` reads the last full pass."""

    def __init__(self, blocks: list[nn.Module], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.passes: list[_Pass] = []
        self._handles = []
        for index, block in enumerate(blocks):
            self._handles.append(block.register_forward_pre_hook(self._on_forward(index), prepend=True))
            self._handles.append(block.register_forward_hook(self._on_output(index)))

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def _on_forward(self, index: int):
        @torch._dynamo.disable
        def hook(_module, _args) -> None:
            if index == 0 and torch.is_grad_enabled():
                self.passes.append(_Pass())
            if self.passes:
                self.passes[-1].forward.append((index, self._stamp()))

        return hook

    def _on_output(self, index: int):
        @torch._dynamo.disable
        def hook(_module, _args, output) -> None:
            if not (self.passes and isinstance(output, torch.Tensor) and output.requires_grad):
                return
            backward = self.passes[-1].backward
            output.register_hook(lambda _grad: backward.append((index, self._stamp())))

        return hook

    def times(self) -> tuple[list[float], float, list[float]]:
        """Of the last pass with a backward: forward ms of every block but the last, ms from the
        last block's forward to the backward's first stamp (its forward, the loss, the output
        layer's backward), and backward ms of every block but the first, from the last down."""
        if self.cuda:
            torch.cuda.synchronize()
        done = [p for p in self.passes if p.backward]
        if not done:
            raise RuntimeError("no forward and backward ran since the timer was attached")
        last = done[-1]
        f = [stamp for _, stamp in last.forward]
        b = [stamp for _, stamp in last.backward]
        forward = [self._ms(f[i], f[i + 1]) for i in range(len(f) - 1)]
        backward = [self._ms(b[i], b[i + 1]) for i in range(len(b) - 1)]
        return forward, self._ms(f[-1], b[0]), backward

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def stream_pools(device: torch.device) -> list[tuple[str, float, float]]:
    """(stream, reserved GiB, allocated GiB now) per allocator pool, largest first; empty on a CPU."""
    if device.type != "cuda":
        return []
    compute = torch.cuda.current_stream(device).cuda_stream
    pools: dict[int, list[int]] = {}
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device.index) not in (device.index, None):
            continue
        pool = pools.setdefault(segment["stream"], [0, 0])
        pool[0] += segment["total_size"]
        pool[1] += segment["allocated_size"]
    names = {s: "compute" if s == compute else f"side stream {s:#x}" for s in pools}
    return sorted(((names[s], r / 2**30, a / 2**30) for s, (r, a) in pools.items()), key=lambda p: -p[1])


def _line(label: str, values: list[float], first: int, step: int) -> str:
    if not values:
        return f"  {label}: (one block)"
    blocks = [first + step * i for i in range(len(values))]
    slow = max(range(len(values)), key=values.__getitem__)
    fast = min(range(len(values)), key=values.__getitem__)
    listed = " ".join(f"{v:.1f}" for v in values)
    return (f"  {label} ms: median {statistics.median(values):.1f}, min {values[fast]:.1f} (block {blocks[fast]}), "
            f"max {values[slow]:.1f} (block {blocks[slow]}); blocks {blocks[0]}..{blocks[-1]}: {listed}")


def format_trace(forward: list[float], tail: float, backward: list[float], pools: list[tuple[str, float, float]]) -> str:
    n = len(forward) + 1
    lines = ["Per-block times on the compute stream (rank 0, one step):",
             _line("forward", forward, 0, 1),
             f"  last block's forward + loss + output layer's backward: {tail:.1f} ms",
             _line("backward", backward, n - 1, -1)]
    if pools:
        lines.append("Allocator pools by stream (reserved / allocated now, GiB): " + ", ".join(
            f"{name} {reserved:.2f} / {allocated:.2f}" for name, reserved, allocated in pools))
    return "\n".join(lines)
