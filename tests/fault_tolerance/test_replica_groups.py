"""Replica groups on torchft, as real processes on CPU (gloo), with a lighthouse in the test:

- without failures, two groups of two ranks (FSDP inside each) step as one job with their
  global batch: the mean of their losses is the one-process run's loss, their weights equal;
- groups killed with SIGKILL ten times in a run: the surviving group keeps stepping and loses no
  step, each restarted group takes the live state of a peer and rejoins, every group ends with
  the same weights and optimizer state, and checkpoints go on beside it (slow: see its docstring).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.ahead import Lane
from tests.fault_tolerance.groups import Group, final_state, lighthouse, output_of, run_alone
from tests.fault_tolerance.groups import wait_until as _wait_until

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

SEEDED = ["--data.loader", "tests.fault_tolerance.paced_loader:build"]


@pytest.fixture
def started(tmp_path):
    """The groups a test started; every process of them is gone when it ends, pass or fail."""
    groups: list[Group] = []
    yield groups
    for group in groups:
        group.kill()


def _kill(process) -> None:
    """End `process` if it still runs (a test that failed before it ended)."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)


def _same(a: dict, b: dict, atol: float = 0.0) -> list[str]:
    """Keys of `a` whose values differ in `b` (tensors within atol)."""
    bad = []
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor):
            same = torch.equal(value, other) if atol == 0 else torch.allclose(value, other, atol=atol, rtol=0)
        else:
            same = value == other
        if not same:
            bad.append(key)
    return bad


def test_two_groups_without_failures_step_as_one_job_with_their_global_batch(tmp_path, started):
    steps = 5
    common = [*SEEDED, "--training.steps", str(steps), "--checkpoint.enable", "true",
              "--checkpoint.interval", str(steps)]
    reference_folder = tmp_path / "one_process"
    reference = run_alone([*common, "--fault_tolerance.enable", "false", "--training.global_batch_size", "8"],
                          reference_folder)
    try:
        with lighthouse() as address:
            started.extend(Group(i, 2, 2, tmp_path, address, common).start() for i in range(2))
            for group in started:
                assert group.wait(300) == [0, 0], group.output()
        reference.wait(300)
    finally:
        _kill(reference)
    assert reference.returncode == 0, output_of(reference_folder)
    ref = {r["step"]: r["loss"] for r in Group.read_records(reference_folder) if "loss" in r}
    per_group = [{r["step"]: r for r in g.records() if "loss" in r} for g in started]
    for step in range(1, steps + 1):
        assert all(g[step]["ft_replicas"] == 2 for g in per_group), (step, per_group)
        mean = (per_group[0][step]["loss"] + per_group[1][step]["loss"]) / 2
        assert mean == pytest.approx(ref[step], rel=1e-5), (step, mean, ref[step])
    states = [final_state(g.folder / f"replica_{g.replica_id}", steps, tmp_path / f"{g.replica_id}.pt")
              for g in started]
    assert _same(states[0]["model"], states[1]["model"]) == []
    assert _same(states[0]["optimizer"], states[1]["optimizer"]) == []
    one = final_state(reference_folder, steps, tmp_path / "ref.pt")
    assert _same(one["model"], states[0]["model"], atol=1e-5) == []


def _rejoined(group: Group) -> bool:
    """The group's present life is in the quorum: a restarted one has taken a peer's state."""
    return group.lives == 1 and group.steps_done() > 0 or "took the live state of a peer" in group.output()


def _stepped_without_one(survivor: Group, after: int) -> bool:
    """The survivor logged a step after step `after` with fewer groups than the three."""
    return any(r["ft_replicas"] < 3 for r in survivor.records() if "loss" in r and r["step"] > after)


def ten_kills(tmp_path: Path, lane: Lane) -> dict:
    """Three groups of one rank; groups 1 and 2 are killed with SIGKILL in turn, ten times, each
    restarted once the survivor has stepped without it (as torchrun's --max-restarts would
    restart it, seconds later) and killed again once it has rejoined; group 0 survives
    throughout. The groups step at GATED_S per step while the kills go on, then at full speed.
    About a minute on 2 idle cores, mostly waiting on the paced steps, so it runs ahead of its
    test (tests/ahead.py); a restart is a fork of a process that imported torch, torchft and
    kenotron (tests/fault_tolerance/groups.py). Returns what the test checks."""
    steps = 300  # the kills take ~40 gated steps on 2 idle cores; 250 may go by before the check below fails
    gate = tmp_path / "slow"
    gate.write_text("")
    common = ["--data.loader", "tests.fault_tolerance.paced_loader:build_gated", "--data.path", str(gate),
              "--training.steps", str(steps), "--checkpoint.enable", "true", "--checkpoint.interval", "50",
              "--checkpoint.keep_latest_k", "2", "--metrics.log_freq", "1"]
    reference_folder = tmp_path / "no_failures"
    started: list[Group] = []
    reference = run_alone([*SEEDED, "--training.steps", str(steps), "--training.global_batch_size", "6"],
                          reference_folder)
    try:
        with lane.killed_at_stop(lambda: [g.kill() for g in started] + [_kill(reference)]), lighthouse() as address:
            started.extend(Group(i, 3, 1, tmp_path, address, common).start() for i in range(3))
            _wait_until(lambda: all(g.steps_done() >= 3 for g in started), 300, "first steps", started)
            kills = 0
            while kills < 10:
                victim = started[1 + kills % 2]
                _wait_until(lambda v=victim: _rejoined(v), 300, f"rejoin of group {victim.replica_id}", started)
                killed_at = started[0].steps_done()
                victim.kill()
                # Restarted at once, a group forked in a fraction of a second is back before its
                # death is noticed: the survivor steps without it first, as after a lost node.
                _wait_until(lambda k=killed_at: _stepped_without_one(started[0], k), 300,
                            f"a step of the survivor without group {victim.replica_id}",
                            [g for g in started if g is not victim])
                victim.start()
                kills += 1
            _wait_until(lambda: all(_rejoined(g) for g in started), 300, "the last rejoins", started)
            survivor_before_the_end = started[0].steps_done()
            gate.unlink()
            codes = [(group.wait(600), group.output()) for group in started]
            reference.wait(600)
    finally:
        for group in started:
            group.kill()
        _kill(reference)
    return {
        "steps": steps, "survivor_before_the_end": survivor_before_the_end, "codes": codes,
        "reference_code": reference.returncode, "reference_output": output_of(reference_folder),
        "survivor": [r for r in started[0].records() if "loss" in r], "lives": [g.lives for g in started],
        "states": [final_state(g.folder / f"replica_{g.replica_id}", steps, tmp_path / f"{g.replica_id}.pt")
                   for g in started],
        "reference_losses": [r["loss"] for r in Group.read_records(reference_folder) if "loss" in r][-50:],
    }


@pytest.mark.slow
@pytest.mark.run_ahead(job=ten_kills)
def test_ten_kills_lose_no_step_of_the_survivor_and_every_group_ends_identical(ran_ahead):
    """ten_kills' run: the survivor logs every step, the killed groups rejoin each time, and every
    group ends with identical weights and optimizer state."""
    run = ran_ahead
    steps = run["steps"]
    assert run["survivor_before_the_end"] < steps - 50, "the survivor finished before the kills ended: raise steps"
    for code, output in run["codes"]:
        assert code == [0], output
    assert run["reference_code"] == 0, run["reference_output"]
    survivor = run["survivor"]
    assert {r["step"] for r in survivor} == set(range(1, steps + 1)), "the survivor lost a step"
    assert min(r["ft_replicas"] for r in survivor) < 3, "the survivor never stepped without a killed group"
    assert run["lives"] == [1, 6, 6]
    states = run["states"]
    for other in states[1:]:
        assert _same(states[0]["model"], other["model"]) == []
        assert _same(states[0]["optimizer"], other["optimizer"]) == []
    # The steps a killed group missed were taken on the others' batches only (torchft averages
    # over the groups present); on these random tokens the loss ends where a run without
    # failures ends, within 2%.
    reference_losses = run["reference_losses"]
    final = [r["loss"] for r in survivor if r["step"] > steps - 50]
    assert sum(final) / len(final) == pytest.approx(sum(reference_losses) / len(reference_losses), rel=0.02)
