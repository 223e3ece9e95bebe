"""Process-group set-up from torchrun's environment, and the device each rank uses."""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from kenotron.errors import ConfigError


@dataclass(frozen=True)
class WorldInfo:
    """Where this process stands: rank, world size, local rank (from torchrun's variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> WorldInfo:
        """From an existing process group if there is one, else torchrun's variables."""
        if dist.is_initialized():
            rank = dist.get_rank()
            return cls(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )

    @property
    def launched(self) -> bool:
        """True under torchrun (even with one process), where a process group is expected."""
        return "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def pick_device(requested: str, world: WorldInfo, expandable_segments: bool = True) -> torch.device:
    """cuda:<local rank> when asked for (or auto and available), else cpu.

    With `expandable_segments` the CUDA caching allocator is configured before the first
    allocation to map memory into growing segments (less fragmentation than fixed blocks).
    """
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device='cuda' but no CUDA device is visible; use 'cpu' or 'auto'")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if expandable_segments:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        device = torch.device("cuda", world.local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_distributed(device: torch.device, timeout_s: float = 600) -> bool:
    """Join the default process group: NCCL for CUDA tensors plus gloo for CPU ones.

    `timeout_s` (parallelism.collective_timeout_s) bounds every collective of the job: it is
    also made the default of the groups created later (device meshes, the checkpointer's gloo
    group), which would otherwise get torch's own default (30 minutes for gloo).
    Returns False when a group already existed (e.g. a notebook or test made it), so the
    caller knows not to destroy it.
    """
    if dist.is_initialized():
        return False
    timeout = datetime.timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    c10d.default_pg_nccl_timeout = timeout
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    return True


def destroy_distributed(*, finished: bool = True) -> None:
    """Tear the process groups down, deliberately.

    After a run that `finished`, every rank first meets the others in a barrier, so that no
    peer still waits on this one, and everything the groups hold is freed before the
    interpreter shuts down: a gloo collective completing during interpreter shutdown runs
    Python from a gloo thread, which aborts the process ("terminate called without an active
    exception", SIGABRT). After a failure there is no barrier (a peer may be gone).
    """
    if not dist.is_initialized():
        return
    if finished:
        dist.barrier()
    dist.destroy_process_group()
    gc.collect()
