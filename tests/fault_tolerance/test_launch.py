"""What the launcher adds for one replica group: its own run folder, torchrun's restarts, and the
lighthouse it starts (or points the ranks at), gone when the group's launch ends."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import pytest

from kenotron.config import load_config
from kenotron.fault_tolerance.lighthouse import prepare_replica_group, replica_group_argv
from kenotron.fault_tolerance.torchft_import import unavailable_reason


def _cfg(*overrides: str):
    return load_config(None, ["--fault_tolerance.enable", "true", "--job.dump_folder", "out", *overrides])


def test_each_group_runs_in_its_own_folder_under_the_jobs(monkeypatch):
    monkeypatch.delenv("RUST_LOG", raising=False)  # set for the ranks: torchft's log, quieter
    argv = ["--fault_tolerance.replica_id", "1"]
    assert replica_group_argv(_cfg(*argv), argv) == [*argv, "--job.dump_folder", "out/replica_1"]


def test_a_given_lighthouse_is_handed_to_the_ranks_with_torchruns_restarts(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    group = prepare_replica_group(_cfg("--fault_tolerance.lighthouse", "http://node0:29510",
                                       "--fault_tolerance.max_restarts", "7"))
    assert os.environ["TORCHFT_LIGHTHOUSE"] == "http://node0:29510"
    assert group.torchrun_args == ["--max-restarts", "7"] and group.lighthouse is None


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_the_lighthouse_a_launcher_starts_serves_until_the_group_ends(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    group = prepare_replica_group(_cfg("--fault_tolerance.lighthouse", "start",
                                       "--fault_tolerance.lighthouse_port", "0"))
    port = urlparse(os.environ["TORCHFT_LIGHTHOUSE"]).port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    group.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
