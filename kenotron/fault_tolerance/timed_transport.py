"""How a restarted group receives a peer's live state: torchft's PGTransport over the groups' own
process group (NCCL between GPUs, gloo on CPU), tensor by tensor, received in place into this
rank's own state, with the rejoin timeline's marks around the transfer.

In place: torchft's PGTransport, given a function that returns a state of the same structure,
receives each tensor straight into that state's storage. Without it, it receives each tensor
into a new device buffer, waits, and copies it to host memory before the next (docs/
fault-tolerance.md, "The live state's transport", has the figures of both). Every group has the
same layout, so this rank's weights and optimizer moments (`local_state`: DTensors as their
local shards) have the sender's structure and storage sizes. The other tensors (the LR schedule's
and the data position's JSON as bytes, whose lengths differ between two states) and a leaf this
rank lacks (optimizer moments before the first step) take torchft's allocating path.

A receive that breaks off part way has overwritten part of this rank's state with the peer's:
the process exits (torchrun restarts it, and it rejoins clean) rather than train on a mix.

torchft's HTTP transport (one pickled stream through host memory on both sides) is not offered:
it was the slower of the two on GPUs and did not always finish (the same section).

Imported by replicas.py once torchft was found to load (torchft_import.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torchft.checkpointing.pg_transport import PGTransport

from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline

logger = logging.getLogger("kenotron")

BROKEN_RECEIVE_EXIT = 75
"""The exit code of a rank whose in-place receive broke off (module docstring): torchrun restarts it."""


def tensors(state: Any) -> list[torch.Tensor]:
    """The tensors of a nested state, in pytree order."""
    return [v for v in tree_flatten(state)[0] if isinstance(v, torch.Tensor)]


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a nested state."""
    return sum(v.numel() * v.element_size() for v in tensors(state))


def in_place_count(received: Any, own: Any) -> int:
    """How many received tensors sit in the storage of one of `own`'s tensors."""
    storages = {t.untyped_storage().data_ptr() for t in tensors(own) if t.numel()}
    return sum(t.untyped_storage().data_ptr() in storages for t in tensors(received) if t.numel())


class TimedPGTransport(PGTransport):
    """torchft's PGTransport receiving in place into `own_state()`, marking the timeline (module
    docstring)."""

    def __init__(self, pg: Any, timeout: timedelta, device: torch.device, own_state: Callable[[], Any],
                 timeline: RejoinTimeline) -> None:
        self._own: Any = None

        def receive_into() -> Any:
            self._own = tree_map(lambda v: v if isinstance(v, torch.Tensor) and v.is_floating_point() else None,
                                 own_state())
            return self._own

        super().__init__(pg, timeout, device, state_dict=receive_into)
        self.timeline = timeline

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        start = time.perf_counter()
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)
        self.timeline.mark("live_state_sent", f"{tensor_bytes(state_dict)} bytes for replica rank(s) {dst_ranks} "
                                              f"at step {step} in {time.perf_counter() - start:.3f} s")

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.timeline.mark("quorum_granted", f"behind: fetching step {step} from replica rank {src_rank}")
        start = time.perf_counter()
        try:
            state = super().recv_checkpoint(src_rank, metadata, step, timeout)
        except Exception as exc:
            if self._own is not None:  # part of this rank's state may be the peer's already
                logger.error("fault tolerance: the live state from replica rank %d broke off (%s: %s); this "
                             "rank's state is part overwritten, so it exits to be restarted", src_rank,
                             type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                logging.shutdown()
                os._exit(BROKEN_RECEIVE_EXIT)
            raise
        received = tensors(state)
        self.timeline.mark("live_state_received",
                           f"{tensor_bytes(state)} bytes in {time.perf_counter() - start:.3f} s, "
                           f"{in_place_count(state, self._own)} of {len(received)} tensors in place")
        self._own = None
        return state


def live_state_transport(pg: Any, timeout: timedelta, device: torch.device, own_state: Callable[[], Any],
                         timeline: RejoinTimeline) -> TimedPGTransport:
    """The transport of a group's live state (module docstring). `own_state()` returns this rank's
    state as torchft's Manager sends it (the same structure on every group)."""
    return TimedPGTransport(pg, timeout, device, own_state, timeline)
