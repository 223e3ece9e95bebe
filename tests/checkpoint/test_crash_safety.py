"""A save killed midway leaves the previous checkpoint as the latest loadable one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kenotron.checkpoint import list_step_folders
from tests.checkpoint.tiny import make_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a training process and its writer process start from scratch (~7 s)
def test_killing_the_writer_process_midway_keeps_the_previous_checkpoint_loadable(tmp_path):
    flag = tmp_path / "writer.pid"
    folder = tmp_path / "ckpt"
    env = {**os.environ, "STALL_FLAG": str(flag), "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen([sys.executable, "-m", "tests.checkpoint.crash_writer", str(folder)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (flag.is_file() and flag.read_text()):
            assert run.poll() is None, f"the training run ended before the stall:\n{run.stdout.read()}"
            assert time.monotonic() < deadline, "the writer never reached the stall"
            time.sleep(0.1)
        stalled = [(f.step, f.complete) for f in list_step_folders(folder)]
        assert any(p.suffix == ".distcp" for p in (folder / "step-000003").iterdir()), "no data written before the kill"
        os.kill(int(flag.read_text()), signal.SIGKILL)
        output, _ = run.communicate(timeout=120)
    finally:  # never leave the run or its stalled writer behind, whatever failed above
        if run.poll() is None:
            run.kill()
            run.wait()
        if flag.is_file() and flag.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(flag.read_text()), signal.SIGKILL)
    assert stalled == [(2, True), (3, False)]
    assert "SAVE FAILED: saving" in output and "the latest complete checkpoint is still step-000002" in output, output
    *_, state, manager, _, _ = make_run("single", folder)
    assert manager.load() == 2 and state.step == 2
