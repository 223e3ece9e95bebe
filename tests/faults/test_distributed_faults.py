"""Failures on one rank of a multi-rank job reach every rank as one clear error, without a hang."""

from __future__ import annotations

import errno

import pytest
import torch.distributed as dist
from torch.distributed.checkpoint import filesystem

from kenotron.checkpoint import CheckpointError, CheckpointSaveError, list_step_folders
from tests.checkpoint.tiny import make_run
from tests.distributed.pool import run_on_ranks


def _save_with_a_full_disk_on_rank_1(folder: str, mode: str) -> str:
    *_, state, manager, _, _ = make_run("fsdp", folder, async_mode=mode)
    state.step = 1
    manager.save(1)
    manager.wait()
    original = filesystem._write_item
    if dist.get_rank() == 1:
        def disk_full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        filesystem._write_item = disk_full
    try:
        state.step = 2
        with pytest.raises(CheckpointSaveError) as failure:
            manager.save(2)
            manager.wait()
        return str(failure.value)
    finally:
        filesystem._write_item = original
        manager.close()


@pytest.mark.parametrize("mode", ["disabled", "async"])
def test_a_disk_full_on_one_rank_fails_the_save_on_every_rank_naming_it(tmp_path, mode):
    messages = run_on_ranks(2, _save_with_a_full_disk_on_rank_1, str(tmp_path), mode)
    for message in messages:
        assert "saving step-000002 failed on rank 1: no space left on the device" in message, message
        assert message.endswith("the latest complete checkpoint is still step-000001"), message
    assert [(f.step, f.complete) for f in list_step_folders(tmp_path)] == [(1, True)]


def _load_into_a_folder_with_a_foreign_step(folder: str) -> str:
    *_, manager, _, _ = make_run("fsdp", folder)
    with pytest.raises(CheckpointError) as failure:
        manager.load()
    return str(failure.value)


def test_rank_0s_refusal_to_use_a_folder_reaches_every_rank(tmp_path):
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "step-000004" / "their.bin").write_bytes(b"x")
    messages = run_on_ranks(2, _load_into_a_folder_with_a_foreign_step, str(tmp_path), timeout=60)
    assert all("holds step-000004, not written by kenotron" in m for m in messages), messages
