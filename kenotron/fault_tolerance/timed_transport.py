"""torchft's checkpoint transports, with the rejoin timeline's marks around a live-state
transfer: when a recovering group starts fetching (its quorum was granted), when it holds the
state (bytes, seconds), and on the sending group how long sending (or staging) took.

`fault_tolerance.live_state_transport` picks one:

- "http" (torchft's HTTPTransport, one stream): the sender copies its state to host memory and
  serves it; the receiver fetches it, unpickles it on the host, and loads it onto its device;
- "process_group" (torchft's PGTransport): the state goes over the groups' own process group
  (NCCL between GPUs, gloo on CPU), tensor by tensor, from device to device; the receiver keeps
  each tensor on the host until it is loaded (torchft allocates it there to spare device memory).

Imported by replicas.py once torchft was found to load (torchft_import.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torchft.checkpointing.http_transport import HTTPTransport

from kenotron.errors import ConfigError
from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline

TRANSPORTS = ("http", "process_group")
"""The values of fault_tolerance.live_state_transport."""


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a nested state."""
    return sum(v.numel() * v.element_size() for v in tree_flatten(state)[0] if isinstance(v, torch.Tensor))


class _Timed:
    """The marks around torchft's send_checkpoint and recv_checkpoint (module docstring)."""

    timeline: RejoinTimeline

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        start = time.perf_counter()
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)  # type: ignore[misc]
        self.timeline.mark("live_state_sent", f"{tensor_bytes(state_dict)} bytes for replica rank(s) {dst_ranks} "
                                              f"at step {step} in {time.perf_counter() - start:.3f} s")

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.timeline.mark("quorum_granted", f"behind: fetching step {step} from replica rank {src_rank}")
        start = time.perf_counter()
        state = super().recv_checkpoint(src_rank, metadata, step, timeout)  # type: ignore[misc]
        self.timeline.mark("live_state_received", f"{tensor_bytes(state)} bytes in {time.perf_counter() - start:.3f} s")
        return state


class TimedHTTPTransport(_Timed, HTTPTransport):
    """torchft's HTTPTransport (num_chunks=0: one stream), marking the timeline."""

    def __init__(self, timeout: timedelta, timeline: RejoinTimeline) -> None:
        super().__init__(timeout=timeout, num_chunks=0)
        self.timeline = timeline


def timed_pg_transport(pg: Any, timeout: timedelta, device: torch.device, timeline: RejoinTimeline) -> Any:
    """torchft's PGTransport over the groups' process group, marking the timeline. Imported here,
    only when chosen: the module imports torch's private DTensor names, which a torch other than
    torchft's may not have (refused in one line)."""
    try:
        from torchft.checkpointing.pg_transport import PGTransport
    except ImportError as exc:
        raise ConfigError(f"fault_tolerance.live_state_transport=\"process_group\" needs torchft's PGTransport, "
                          f"which does not load with torch {torch.__version__} ({exc}); set "
                          "fault_tolerance.live_state_transport=\"http\"") from None

    class TimedPGTransport(_Timed, PGTransport):
        def __init__(self) -> None:
            super().__init__(pg, timeout, device)
            self.timeline = timeline

    return TimedPGTransport()


def live_state_transport(kind: str, pg: Any, timeout: timedelta, device: torch.device,
                         timeline: RejoinTimeline) -> Any:
    """The transport fault_tolerance.live_state_transport names (module docstring)."""
    if kind == "process_group":
        return timed_pg_transport(pg, timeout, device, timeline)
    return TimedHTTPTransport(timeout, timeline)
