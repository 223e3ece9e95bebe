"""A save killed midway leaves the previous checkpoint as the latest loadable one."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from kenotron.checkpoint import list_step_folders
from tests.checkpoint.tiny import make_run
from tests.fork_server import start_python


@pytest.mark.slow  # the writer process starts from scratch (~4 s)
def test_killing_the_writer_process_midway_keeps_the_previous_checkpoint_loadable(tmp_path):
    flag = tmp_path / "writer.pid"
    folder = tmp_path / "ckpt"
    log = tmp_path / "run.txt"
    run = start_python(["-m", "tests.checkpoint.crash_writer", str(folder)], log, {"STALL_FLAG": str(flag)})
    try:
        deadline = time.monotonic() + 120
        while not (flag.is_file() and flag.read_text()):
            assert run.poll() is None, f"the training run ended before the stall:\n{log.read_text()}"
            assert time.monotonic() < deadline, "the writer never reached the stall"
            time.sleep(0.1)
        stalled = [(f.step, f.complete) for f in list_step_folders(folder)]
        assert any(p.suffix == ".distcp" for p in (folder / "step-000003").iterdir()), "no data written before the kill"
        os.kill(int(flag.read_text()), signal.SIGKILL)
        run.wait(120)
        output = log.read_text()
    finally:  # never leave the run or its stalled writer behind, whatever failed above
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(60)
        if flag.is_file() and flag.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(flag.read_text()), signal.SIGKILL)
    assert stalled == [(2, True), (3, False)]
    assert "SAVE FAILED: saving" in output and "the latest complete checkpoint is still step-000002" in output, output
    *_, state, manager, _, _ = make_run("single", folder)
    assert manager.load() == 2 and state.step == 2
