"""What one training step moves besides compute, counted on CPU: bytes written by copy kernels,
and the gradient all-reduces (calls and bytes). The DDP engine tests compare the counts of DDP 2
with those of one rank running the same micro-batches."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from kenotron.config import load_config
from kenotron.train.step import clip_gradients, forward_backward, optimizer_step
from kenotron.train.trainer import Trainer
from tests.parallel.parity import BASE

_COPIES = {"copy_", "_to_copy", "cat", "chunk_cat", "_chunk_cat", "_foreach_copy_", "clone", "split_with_sizes_copy",
           "_foreach_add_", "add_"}
"""Kernels that move a tensor's bytes into another buffer (FSDP's copy into its flat reduce buffer
is fsdp::chunk_cat), and the in-place adds that accumulate gradients."""
_ALL_REDUCES = {"allreduce_", "allreduce_coalesced_"}


def _written_bytes(out: object) -> int:
    tensors = out if isinstance(out, (list, tuple)) else [out]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class TrafficCounter(TorchDispatchMode):
    """Counts, while active, the bytes the copy kernels write and the all-reduces with their bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.copied_bytes = 0
        self.all_reduces = 0
        self.reduced_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _COPIES:
            self.copied_bytes += _written_bytes((kwargs or {}).get("out", out))
        elif name in _ALL_REDUCES:
            self.all_reduces += 1
            self.reduced_bytes += _written_bytes(args[0])
        return out


def step_traffic(overrides: list[str], dump_folder: str) -> dict[str, int]:
    """One warm-up step, then the counts of the second step's forward and backward passes (all its
    micro-steps, up to the gradients the optimizer reads); also the parameters' fp32 bytes."""
    cfg = load_config(None, BASE + ["--job.dump_folder", dump_folder, "--training.steps", "2"] + overrides)
    trainer = Trainer(cfg)
    job = trainer.job
    forward_backward(job, trainer.loader.next_step())
    clip_gradients(job)
    optimizer_step(job)
    batch = trainer.loader.next_step()
    counter = TrafficCounter()
    with counter:
        forward_backward(job, batch)
    if dist.is_initialized():
        dist.barrier()
    params = {id(p): p for part in job.model_parts for p in part.parameters()}
    trainer.close()
    return {"copied_bytes": counter.copied_bytes, "all_reduces": counter.all_reduces,
            "reduced_bytes": counter.reduced_bytes, "param_fp32_bytes": 4 * sum(p.numel() for p in params.values())}
