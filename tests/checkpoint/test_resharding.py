"""Save under one layout, load under another: FSDP 4 -> FSDP 2 x TP 2 -> 1 process."""

from __future__ import annotations

import pytest

from tests.checkpoint.tiny import run_layout
from tests.distributed.pool import run_on_ranks


def test_fsdp4_checkpoint_resumes_under_fsdp2_tp2_then_one_process_with_the_same_losses(tmp_path):
    folder = str(tmp_path)
    reference = run_on_ranks(4, run_layout, "fsdp", folder, until=4, save_at=(2,))[0]
    resumed_tp = run_on_ranks(4, run_layout, "fsdp_tp", folder, until=4, save_at=(3,), load=True)[0]
    resumed_one = run_layout("single", folder, until=4, load=True)
    assert sorted(resumed_tp) == [3, 4] and sorted(resumed_one) == [4]
    for step in (3, 4):
        assert resumed_tp[step] == pytest.approx(reference[step], abs=1e-5), f"FSDP2xTP2 loss at step {step}"
    assert resumed_one[4] == pytest.approx(reference[4], abs=1e-5), "1-process loss at step 4"
