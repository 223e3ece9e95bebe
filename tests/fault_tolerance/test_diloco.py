"""DiLoCo over two replica groups (fault_tolerance.sync_every = 3): each group trains alone for
three steps, then the outer step. With outer_lr 1 and no momentum the outer step sets the
weights to the mean of the groups' own (original - 1 x mean(original - local)): the groups end
with exactly the mean of two one-process runs on their data slices. Four processes: marked slow
(about 15 s on two idle cores; the fast suite's budget goes to the synchronous groups' test)."""

from __future__ import annotations

import pytest
import torch

from kenotron.fault_tolerance.torchft_import import unavailable_reason
from tests.fault_tolerance.groups import Group, final_state, lighthouse, output_of, run_alone
from tests.fault_tolerance.test_replica_groups import _kill, _same, started  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.mark.slow
def test_diloco_groups_end_a_sync_with_the_mean_of_their_own_weights(tmp_path, started):  # noqa: F811
    steps = 3
    common = ["--training.steps", str(steps), "--checkpoint.enable", "true", "--checkpoint.interval", str(steps)]
    alone = [run_alone([*common, "--data.loader", f"tests.fault_tolerance.paced_loader:build_slice_{index}"],
                       tmp_path / f"alone_{index}") for index in range(2)]
    try:
        with lighthouse() as address:
            diloco = ["--data.loader", "tests.fault_tolerance.paced_loader:build", "--fault_tolerance.sync_every", "3",
                      "--fault_tolerance.outer_lr", "1", "--fault_tolerance.outer_momentum", "0", *common]
            started.extend(Group(i, 2, 1, tmp_path, address, diloco).start() for i in range(2))
            for group in started:
                assert group.wait(300) == [0], group.output()
        codes = [p.wait(300) for p in alone]
    finally:
        for p in alone:
            _kill(p)
    assert codes == [0, 0], [output_of(tmp_path / f"alone_{i}") for i in range(2)]
    groups = [final_state(tmp_path / f"replica_{i}", steps, tmp_path / f"g{i}.pt")["model"] for i in range(2)]
    own = [final_state(tmp_path / f"alone_{i}", steps, tmp_path / f"a{i}.pt")["model"] for i in range(2)]
    assert _same(groups[0], groups[1]) == []
    mean = {k: (own[0][k] + own[1][k]) / 2 for k in own[0]}
    assert _same(mean, groups[0], atol=1e-6) == []
    assert any(not torch.equal(own[0][k], own[1][k]) for k in own[0]), "the slices should train apart"
    records = [r for r in started[0].records() if "loss" in r]
    assert records[-1]["ft_syncs"] == 1 and records[-1]["ft_replicas"] == 2, records[-1]
