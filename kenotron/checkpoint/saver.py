"""The three save modes, on top of `torch.distributed.checkpoint` (DCP).

- `disabled` (synchronous): `dcp.save`; training waits for the whole write.
- `async`: `dcp.async_save` in a thread. The state is first copied to CPU memory (training
  waits for that copy), then written in the background.
- `async_with_pinned_mem`: `dcp.async_save` with a stager (`ReusingStager`) that copies the
  state in a background thread into shared (and, on CUDA, pinned) host memory, reused from one
  save to the next, and a separate writer process (DCP's `AsyncCheckpointerType.PROCESS`) that
  writes it. Training continues during the copy, but must not change the parameters before it
  is done: call `wait_for_staging()` before the next `optimizer.step()` (a step during the copy
  saves a mix of two steps).

Only one save is in flight at a time: the next copy overwrites the buffers of the previous
one, so it may only start once the previous write is done.

Background saves talk over their own gloo process group, made here, so that their collectives
never interleave with the training loop's on the default group. The writer process of
`async_with_pinned_mem` is DCP's: one per training process, started by the first such save
(seconds: it imports torch) and stopped when the training process exits. Because it re-imports
the entry script, that script needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

# Private in both torch 2.11 and 2.13; it is what DefaultStager wraps.
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from kenotron.checkpoint.errors import CheckpointError
from kenotron.config.sections import CHECKPOINT_ASYNC_MODES

AsyncMode = Literal["disabled", "async", "async_with_pinned_mem"]
ASYNC_MODES = CHECKPOINT_ASYNC_MODES
NO_GROUP_FOR_WRITER_PROCESS = (
    "checkpoint.async_mode='async_with_pinned_mem' writes from a separate process that joins a process group, "
    "but none is initialized; launch with torchrun (run_train.sh does, also for one process) or use "
    "checkpoint.async_mode='async'"
)


@dataclass
class SaveInFlight:
    """A save that DCP has started; `staged` and `written` are None when already done."""

    path: Path
    staged: Future | None
    """Done once the state is copied out of the training tensors (async_with_pinned_mem only)."""
    written: Future | None
    """Done once every rank's data and DCP's .metadata are on disk (its exception if the write failed)."""


class DcpSaver:
    """Starts DCP saves of a state dict into a folder, in one of the three modes."""

    def __init__(self, mode: str, process_group: dist.ProcessGroup | None = None) -> None:
        if mode not in ASYNC_MODES:
            raise CheckpointError(f"checkpoint.async_mode={mode!r} is not one of {', '.join(ASYNC_MODES)}")
        self.mode = mode
        self.process_group = process_group
        distributed = dist.is_available() and dist.is_initialized()
        if mode == "async_with_pinned_mem" and not distributed:
            raise CheckpointError(NO_GROUP_FOR_WRITER_PROCESS)
        # A gloo group of its own for background saves (see the module docstring).
        self._background_group = dist.new_group(backend="gloo") if mode != "disabled" and distributed else None
        self._stager = ReusingStager() if mode == "async_with_pinned_mem" else None
        if mode == "async_with_pinned_mem":
            _writer_joins_the_launchers_store()

    def start(self, state_dict: dict[str, Any], path: Path) -> SaveInFlight:
        """Start saving `state_dict` (values: tensors, DTensors, plain objects) into `path`."""
        checkpoint_id = str(path)
        if self.mode == "disabled":
            dcp.save(state_dict, checkpoint_id=checkpoint_id, process_group=self.process_group)
            return SaveInFlight(path, staged=None, written=None)
        if self.mode == "async":
            future = dcp.async_save(
                state_dict, checkpoint_id=checkpoint_id, process_group=self._background_group,
                async_checkpointer_type=AsyncCheckpointerType.THREAD,
            )
            return SaveInFlight(path, staged=None, written=future)
        response = dcp.async_save(
            state_dict, checkpoint_id=checkpoint_id, process_group=self._background_group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=self._stager,
        )
        # With a background-thread stager DCP answers with both futures; older versions that
        # stage synchronously answer with the write future alone.
        if isinstance(response, Future):
            return SaveInFlight(path, staged=None, written=response)
        return SaveInFlight(path, staged=response.staging_completion, written=response.upload_completion)

    def close(self) -> None:
        """Free the staging buffers. The caller has waited for the save in flight."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None



def _writer_joins_the_launchers_store() -> None:
    """DCP's writer processes meet through a store. By default rank 0 picks a free port, closes it
    and its writer, seconds later (a new Python importing torch), listens on it: any connection
    opened meanwhile may take that port (EADDRINUSE, seen with two test sessions side by side).
    Where the launcher's store is known (torchrun's MASTER_ADDR and MASTER_PORT), the writers join
    it under their own key prefix instead (DCP_USE_PREFIX_STORE, read by DCP at its first process
    save); no port is picked. An explicit DCP_USE_PREFIX_STORE is left as it is."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        os.environ.setdefault("DCP_USE_PREFIX_STORE", "1")


class ReusingStager(AsyncStager):
    """Copies a state dict into host memory in a background thread, into buffers that later saves reuse.

    The buffers are shared memory (the writer process maps them instead of receiving a pickled
    copy) and, on CUDA, pinned, filled by non-blocking copies on a side stream. They are allocated
    by the first save and reused by the next ones (the caller waits for a save's write before
    starting the next copy). DCP's DefaultStager in torch 2.11 frees its buffers after every
    copy, so each save would allocate and pin them again while training waits (the cost is
    measured in docs/checkpointing.md).
    """

    _synchronize_after_execute = False  # the caller waits on the staging future instead

    def __init__(self) -> None:
        self._on_cuda = torch.cuda.is_available()
        self._copier = StateDictStager(pin_memory=self._on_cuda, share_memory=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kenotron-staging")
        # Made on the calling thread, after the training stream exists (as DefaultStager does).
        self._stream = torch.cuda.Stream() if self._on_cuda else None

    def stage(self, state_dict: dict[str, Any]) -> Future:
        if self._stream is not None:
            # The copies must see the optimizer step already queued on the training stream.
            self._stream.wait_stream(torch.cuda.current_stream())
        return self._executor.submit(self._copy, state_dict)

    def _copy(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self._stream is None:
            return self._copier.stage(state_dict, non_blocking=False)
        with torch.cuda.stream(self._stream):
            staged = self._copier.stage(state_dict, non_blocking=True)
        self._stream.synchronize()
        return staged

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._copier.close()
