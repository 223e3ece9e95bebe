"""torchft's HTTP checkpoint transport, with the rejoin timeline's marks around a live-state
transfer: when a recovering group starts fetching (its quorum was granted), when it holds the
state (bytes, seconds), and on the sending group how long staging its state took.

Imported by replicas.py once torchft was found to load (torchft_import.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torchft.checkpointing.http_transport import HTTPTransport

from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a nested state."""
    return sum(v.numel() * v.element_size() for v in tree_flatten(state)[0] if isinstance(v, torch.Tensor))


class TimedHTTPTransport(HTTPTransport):
    """HTTPTransport (one stream per fetch: torchft's num_chunks=0) that marks the timeline."""

    def __init__(self, timeout: timedelta, timeline: RejoinTimeline) -> None:
        super().__init__(timeout=timeout, num_chunks=0)
        self.timeline = timeline

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        start = time.perf_counter()
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)
        self.timeline.mark("live_state_sent", f"{tensor_bytes(state_dict)} bytes staged for replica rank(s) "
                                              f"{dst_ranks} at step {step} in {time.perf_counter() - start:.3f} s")

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.timeline.mark("quorum_granted", f"behind: fetching step {step} from replica rank {src_rank}")
        start = time.perf_counter()
        state = super().recv_checkpoint(src_rank, metadata, step, timeout)
        self.timeline.mark("live_state_received", f"{tensor_bytes(state)} bytes in {time.perf_counter() - start:.3f} s")
        return state

