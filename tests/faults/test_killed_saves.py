"""A job killed in the middle of a save, in every save mode, loses nothing.

(The separate writer process of async_with_pinned_mem killed alone, with the training process
going on, is covered by tests/checkpoint/test_crash_safety.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from kenotron.checkpoint import list_step_folders
from kenotron.checkpoint.folders import STAMP_NAME
from tests.checkpoint.tiny import make_run, run_layout
from tests.fork_server import start_python


@pytest.mark.slow  # a training process saves twice, its writer process starts from scratch
@pytest.mark.parametrize("mode", ["disabled", "async", "async_with_pinned_mem"])
def test_killing_the_job_during_a_save_keeps_the_previous_checkpoint(tmp_path, mode):
    folder, flag = tmp_path / "ckpt", tmp_path / "stalled.pid"
    log = tmp_path / "run.txt"
    run = start_python(["-m", "tests.faults.stalled_save", mode, str(folder)], log, {"STALL_FLAG": str(flag)})
    try:
        deadline = time.monotonic() + 120
        while not (flag.is_file() and flag.read_text()):
            assert run.poll() is None, f"the run ended before the stall:\n{log.read_text()}"
            assert time.monotonic() < deadline, "the save never reached the stall"
            time.sleep(0.1)
        for pid in {run.pid, int(flag.read_text())}:  # the training process and, if another, the writer
            os.kill(pid, signal.SIGKILL)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(60)
        if flag.is_file() and flag.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(flag.read_text()), signal.SIGKILL)
    interrupted = folder / "step-000003"
    assert [(f.step, f.complete) for f in list_step_folders(folder)] == [(2, True), (3, False)]
    assert (interrupted / STAMP_NAME).is_file() and any(p.suffix == ".distcp" for p in interrupted.iterdir())
    *_, state, manager, _, _ = make_run("single", folder)
    assert manager.load() == 2 and state.step == 2
    # The killed save is kenotron's own debris: the next save past it removes it.
    run_layout("single", folder, until=4, save_at=(4,), load=True)
    assert [(f.step, f.complete) for f in list_step_folders(folder)] == [(2, True), (4, True)]
