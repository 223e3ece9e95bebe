"""A group killed with SIGKILL and restarted at once rejoins over the process-group transport
(the groups' gloo group on CPU), receiving the peer's tensors in place into its own state, and its
new process logs every phase of its start on the rejoin timeline, in order, which the bench's
reader turns into seconds per phase (kenotron/fault_tolerance/rejoin_timeline.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from kenotron.fault_tolerance.rejoin_timeline import START_PHASES, parse_marks, rejoin_breakdown
from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.ahead import Lane
from tests.fault_tolerance.groups import Group, final_state, lighthouse

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _wait_until(condition, timeout: float, what: str, groups: list[Group]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for g in groups for p in g.procs):
            raise AssertionError(f"no {what}:\n" + "\n".join(g.output()[-3000:] for g in groups))
        time.sleep(0.05)


def kill_and_rejoin(tmp_path: Path, lane: Lane) -> dict:
    """Two groups of one rank; group 1 is killed and restarted at once. Mostly waiting on paced
    steps, so it runs ahead of its test (tests/ahead.py). Returns what the test checks."""
    steps = 30
    gate = tmp_path / "slow"
    gate.write_text("")
    common = ["--data.loader", "tests.fault_tolerance.paced_loader:build_gated", "--data.path", str(gate),
              "--training.steps", str(steps), "--checkpoint.enable", "true", "--checkpoint.interval", str(steps)]
    groups: list[Group] = []
    try:
        with lane.killed_at_stop(lambda: [g.kill() for g in groups]), lighthouse() as address:
            groups = [Group(i, 2, 1, tmp_path, address, common).start() for i in range(2)]
            _wait_until(lambda: groups[1].steps_done() >= 2, 120, "first steps", groups)
            survivor_before = len(groups[0].output())
            killed_at = time.time()
            groups[1].kill()
            groups[1].start()
            _wait_until(lambda: "first_step_done" in groups[1].output(), 120, "rejoin", groups)
            gate.unlink()
            codes = [(group.wait(120), group.output()) for group in groups]
    finally:
        for group in groups:
            group.kill()
    return {"codes": codes, "restarted": groups[1].output(), "survivor": groups[0].output()[survivor_before:],
            "killed_at": killed_at,
            "states": [final_state(g.folder / f"replica_{g.replica_id}", steps, tmp_path / f"{g.replica_id}.pt")
                       for g in groups]}


@pytest.mark.run_ahead(job=kill_and_rejoin)
def test_a_killed_group_rejoins_over_the_process_group_and_logs_its_start_phases_in_order(ran_ahead):
    run = ran_ahead
    for code, output in run["codes"]:
        assert code == [0], output
    restarted = parse_marks(run["restarted"])
    assert [m.phase for m in restarted] == list(START_PHASES)  # behind the survivor: it took its state
    report = rejoin_breakdown(restarted, parse_marks(run["survivor"]), run["killed_at"])
    assert all(seconds >= 0 for seconds in report["phases_s"].values()), report
    received = report["details"]["live_state_received"]
    assert received.split()[0] == report["details"]["survivor_live_state_sent"].split()[0]
    in_place, total = re.search(r"(\d+) of (\d+) tensors in place", received).groups()
    assert 0 < int(in_place) <= int(total), received  # at least the weights: no copy through host memory
    states = run["states"]
    for part in ("model", "optimizer"):
        for key, value in states[0][part].items():
            other = states[1][part][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (part, key)
