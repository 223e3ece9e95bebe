"""Before training: can the checkpoint folder take a checkpoint of this run?

Without this, a read-only or full folder is found at the first save, checkpoint.interval
steps (hours, on a large run) into training. Here rank 0 creates the folder, writes, syncs and
deletes a small file, and compares the free space with the size of one checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from kenotron.checkpoint.diagnose import explain_os_error, format_bytes, free_bytes
from kenotron.checkpoint.errors import CheckpointError

PROBE_BYTES = 64 << 10


def estimate_checkpoint_bytes(model_parts: Sequence[nn.Module], optimizer_states_per_param: int) -> int:
    """A lower bound of one checkpoint's size: the parameters (global sizes, also of DTensor
    shards) plus `optimizer_states_per_param` fp32 values per parameter (AdamW: 2)."""
    total = 0
    for part in model_parts:
        for p in part.parameters():
            total += p.numel() * p.element_size() + p.numel() * 4 * optimizer_states_per_param
    return total


def check_folder_writable(folder: str | Path, needed_bytes: int = 0) -> None:
    """CheckpointError with the cause and the fix unless `folder` takes a file and has room for
    `needed_bytes`."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint folder {folder} cannot be created: {explain_os_error(exc)}; fix its permissions or set "
            f"checkpoint.folder (or job.dump_folder) to a writable place"
        ) from None
    probe = folder / f".kenotron-write-test-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(bytes(PROBE_BYTES))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint folder {folder} is not writable: {explain_os_error(exc)}; free space, fix its permissions or "
            f"set checkpoint.folder (or job.dump_folder) to a writable place"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    free = free_bytes(folder)
    if needed_bytes and free is not None and free < needed_bytes:
        raise CheckpointError(
            f"checkpoint folder {folder} has {format_bytes(free)} free, but one checkpoint of this run takes at least "
            f"{format_bytes(needed_bytes)}; free space, or point checkpoint.folder at a larger disk"
        )


def optimizer_states_per_param(optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """fp32 values per parameter that the optimizers keep: 2 for Adam-like (moments), 0 for plain SGD."""
    if not optimizers:
        return 0
    names = {type(o).__name__.lower() for o in optimizers}
    return 2 if any("adam" in n for n in names) else 0
