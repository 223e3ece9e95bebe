"""A group killed with SIGKILL and restarted at once rejoins over the process-group transport
(the groups' gloo group on CPU) from the survivor's live state, received in place into its own
weights, without reading the checkpoint its first life wrote, and its new process
logs every phase of its start on the rejoin timeline, in order, which the bench's reader turns
into seconds per phase (kenotron/fault_tolerance/rejoin_timeline.py). Then the whole job
restarts: each group resumes from its own checkpoint, and the group whose checkpoint is older
takes the other's state."""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from kenotron.checkpoint.folders import list_step_folders
from kenotron.fault_tolerance.rejoin_timeline import START_PHASES, parse_marks, rejoin_breakdown
from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.ahead import Lane
from tests.fault_tolerance.groups import FAST_LIGHTHOUSE, Group, final_state, lighthouse, wait_until

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

STEPS = 30
"""The first run's steps; the whole-job restart trains RESTARTED_STEPS."""
RESTARTED_STEPS = 32


def _has_checkpoint(group: Group) -> bool:
    return any(f.complete for f in list_step_folders(group.folder / f"replica_{group.replica_id}" / "checkpoints"))


def kill_and_rejoin(tmp_path: Path, lane: Lane) -> dict:
    """Two groups of one rank, a checkpoint every 2 steps; group 1 is killed once it wrote one and
    restarted at once; then both end, group 1's last checkpoint is removed (its latest is now 2
    steps older than group 0's) and both restart together for 2 more steps. Mostly waiting on
    paced steps, so it runs ahead of its test (tests/ahead.py). Returns what the test checks."""
    gate = tmp_path / "slow"
    gate.write_text("")
    common = ["--data.loader", "tests.fault_tolerance.paced_loader:build_gated", "--data.path", str(gate),
              "--training.steps", str(STEPS), "--checkpoint.enable", "true", "--checkpoint.interval", "2"]
    groups: list[Group] = []
    try:
        with lane.killed_at_stop(lambda: [g.kill() for g in groups]), lighthouse() as address:
            groups = [Group(i, 2, 1, tmp_path, address, common).start() for i in range(2)]
            wait_until(lambda: groups[1].steps_done() >= 2 and _has_checkpoint(groups[1]), 120,
                       "first steps and checkpoint", groups)
            survivor_before = len(groups[0].output())
            killed_at = time.time()
            groups[1].kill()
            groups[1].start()
            wait_until(lambda: "first_step_done" in groups[1].output(), 120, "rejoin", groups)
            gate.unlink()
            codes = [(group.wait(120), group.output()) for group in groups]
        restarted, survivor = groups[1].output(), groups[0].output()[survivor_before:]
        rejoined = [final_state(g.folder / f"replica_{g.replica_id}", STEPS, tmp_path / f"{g.replica_id}.pt")
                    for g in groups]
        shutil.rmtree(groups[1].folder / "replica_1" / "checkpoints" / f"step-{STEPS:06d}")
        # Both groups in every quorum: each reads its checkpoint, none finds a peer ahead at step 0.
        with lighthouse(dataclasses.replace(FAST_LIGHTHOUSE, min_replicas=2)) as address:
            for group in groups:
                group.address, group.extra = address, [*common, "--training.steps", str(RESTARTED_STEPS)]
                group.start()
            restart_codes = [(group.wait(120), group.output()) for group in groups]
    finally:
        for group in groups:
            group.kill()
    return {"codes": codes, "restart_codes": restart_codes, "restarted": restarted, "survivor": survivor, "killed_at": killed_at,
            "rejoined": rejoined, "whole_job_restart": [g.output() for g in groups],
            "restarted_states": [final_state(g.folder / f"replica_{g.replica_id}", RESTARTED_STEPS,
                                             tmp_path / f"{g.replica_id}_restarted.pt") for g in groups]}


def _identical(states: list[dict]) -> None:
    for part in ("model", "optimizer"):
        for key, value in states[0][part].items():
            other = states[1][part][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (part, key)


@pytest.mark.run_ahead(job=kill_and_rejoin)
def test_a_killed_group_rejoins_from_its_peer_without_reading_its_checkpoint_and_logs_its_start_in_order(ran_ahead):
    run = ran_ahead
    for code, output in run["codes"]:
        assert code == [0], output
    assert "loaded step-" not in run["restarted"]  # a peer was ahead: its own checkpoint is older
    restarted = parse_marks(run["restarted"])
    # behind the survivor: it took its state, and read no checkpoint
    assert [m.phase for m in restarted] == [p for p in START_PHASES if p != "checkpoint_loaded"]
    report = rejoin_breakdown(restarted, parse_marks(run["survivor"]), run["killed_at"])
    assert all(seconds >= 0 for seconds in report["phases_s"].values()), report
    received = report["details"]["live_state_received"]
    assert received.split()[0] == report["details"]["survivor_live_state_sent"].split()[0]
    in_place, total = re.search(r"(\d+) of (\d+) tensors in place", received).groups()
    assert 0 < int(in_place) <= int(total), received  # at least the weights: no copy through host memory
    _identical(run["rejoined"])


@pytest.mark.run_ahead(job=kill_and_rejoin)
def test_a_whole_job_restart_resumes_each_group_from_its_checkpoint_and_ends_identical(ran_ahead):
    for code, output in ran_ahead["restart_codes"]:
        assert code == [0], output
    group_0, group_1 = ran_ahead["whole_job_restart"]
    assert f"loaded step-{STEPS:06d}" in group_0
    assert f"loaded step-{STEPS - 2:06d}" in group_1  # older than group 0's: it then took group 0's state
    assert f"took the live state of a peer at step {STEPS}" in group_1
    for output in (group_0, group_1):
        assert "checkpoint_loaded" in output and "first_step_done at" in output
    _identical(ran_ahead["restarted_states"])
