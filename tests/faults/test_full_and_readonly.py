"""Read-only and full checkpoint folders: refused before training, or a save failure that says why."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from torch.distributed.checkpoint import filesystem

from kenotron.checkpoint import CheckpointError, CheckpointSaveError, list_step_folders
from tests.checkpoint.tiny import make_run
from tests.faults.small_fs import fill, make_read_only, small_tmpfs


def test_a_read_only_folder_is_refused_before_training(tmp_path):
    with small_tmpfs(tmp_path / "ro", 1024) as mount:
        make_read_only(mount)
        *_, manager, _, _ = make_run("single", mount / "ckpt")
        with pytest.raises(CheckpointError, match=r"checkpoint folder .*ckpt cannot be created: the filesystem is "
                                                  r"read-only"):
            manager.load()


def test_a_folder_without_room_for_one_checkpoint_is_refused_before_training(tmp_path):
    with small_tmpfs(tmp_path / "small", 1024) as mount:
        *_, manager, _, _ = make_run("single", mount)
        with pytest.raises(CheckpointError, match=r"has 1.0 MiB free, but one checkpoint of this run takes at least "
                                                  r"\d+\.\d MiB; free space, or point checkpoint.folder"):
            manager.load()


def test_a_disk_that_fills_during_training_fails_the_save_with_the_cause(tmp_path):
    with small_tmpfs(tmp_path / "fills", 128 * 1024) as mount:
        *_, state, manager, _, _ = make_run("single", mount)
        assert manager.load() is None
        state.step = 1
        manager.save(1)
        fill(mount, leave_kib=256)
        state.step = 2
        with pytest.raises(CheckpointSaveError) as failure:
            manager.save(2)
        message = str(failure.value)
        assert "no space left on the device" in message and "is full" in message, message
        assert message.endswith("the latest complete checkpoint is still step-000001"), message
        assert [(f.step, f.complete) for f in list_step_folders(mount)] == [(1, True)]  # the partial save is gone


def test_an_unwritable_folder_is_reported_with_its_os_error(tmp_path, monkeypatch):
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    *_, manager, _, _ = make_run("single", tmp_path)
    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(CheckpointError, match=r"checkpoint folder .* is not writable: permission denied at .*; free "
                                              r"space, fix its permissions"):
        manager.load()


@pytest.mark.parametrize("mode", ["disabled", "async"])
def test_an_io_error_while_writing_fails_the_save_naming_the_rank_and_cause(tmp_path, monkeypatch, mode, caplog):
    *_, state, manager, _, _ = make_run("single", tmp_path, async_mode=mode)
    state.step = 1
    manager.save(1)
    manager.wait()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem, "_write_item", disk_full)
    with pytest.raises(CheckpointSaveError, match=r"saving step-000002 failed on rank 0: no space left on the device "
                                                  r"\(No space left on device\); the disk holding .* is full .*the "
                                                  r"latest complete checkpoint is still step-000001"):
        manager.save(2)
        manager.wait()
    assert [(f.step, f.complete) for f in list_step_folders(tmp_path)] == [(1, True)]
    # The one line above is all: no log line with DCP's message (every rank's traceback) before it.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
