"""The live-state transport: a receive that breaks off part way ends the rank (its state may be
part the peer's), and the count of tensors received in place is read off storages."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.ahead import Lane
from tests.fork_server import fork_server

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

BROKEN_RECEIVE = textwrap.dedent("""
    import logging, sys
    from datetime import timedelta
    import torch
    from kenotron.fault_tolerance.rejoin_timeline import RejoinTimeline
    from kenotron.fault_tolerance.timed_transport import live_state_transport

    class PeerGone:  # the process group's receive, failing as NCCL/gloo do when the sender died
        def recv(self, tensors, src, tag):
            class Work:
                def wait(self, timeout=None):
                    raise RuntimeError("Connection closed by peer")
            return Work()

    logging.basicConfig(stream=sys.stdout, level=logging.INFO)
    own = {"user": {"kenotron": {"model": {"w": torch.zeros(4)}}}, "torchft": {"step": 0}}
    transport = live_state_transport(PeerGone(), timedelta(seconds=1), torch.device("cpu"), lambda: own,
                                     RejoinTimeline(1))
    transport.recv_checkpoint(src_rank=0, metadata="", step=3, timeout=timedelta(seconds=1))
    print("returned")
""")


def broken_receive(folder: Path, lane: Lane) -> tuple[int, str, str]:
    """The `run_ahead` job (tests/ahead.py): BROKEN_RECEIVE in a process forked from a server that
    imported torch and torchft (seconds to start, ahead of the test); its exit code, stdout, stderr."""
    return fork_server(("torch", "torchft")).run(["-c", BROKEN_RECEIVE], 120)


@pytest.mark.run_ahead(job=broken_receive)
def test_a_receive_broken_off_part_way_exits_the_rank_with_the_restart_code(ran_ahead):
    from kenotron.fault_tolerance.timed_transport import BROKEN_RECEIVE_EXIT

    code, out, err = ran_ahead
    assert code == BROKEN_RECEIVE_EXIT, out + err
    assert "broke off (RuntimeError: Connection closed by peer)" in out + err
    assert "returned" not in out


def test_in_place_count_counts_received_tensors_in_the_own_states_storages():
    from kenotron.fault_tolerance.timed_transport import in_place_count

    own = {"w": torch.zeros(6), "m": torch.zeros(3), "json": None}
    received = {"w": own["w"].as_strided((2, 3), (3, 1)), "m": torch.ones(3), "json": torch.zeros(5, dtype=torch.uint8)}
    assert in_place_count(received, own) == 1
