"""A save killed midway leaves the previous checkpoint as the latest loadable one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kenotron.checkpoint import list_step_folders
from tests.ahead import Lane
from tests.checkpoint.tiny import make_run
from tests.stalled_run import stalled_run


def kill_the_writer(folder: Path, lane: Lane) -> dict:
    """The `run_ahead` job (tests/ahead.py): a training run (crash_writer.py) whose writer process
    stalls in the save of step 3 is killed there; ~4 s of a spawned writer's imports, waited for
    ahead of the test. Gives the checkpoint folder, its step folders at the stall and what the
    training process printed once its writer was gone."""
    checkpoint = folder / "ckpt"
    with stalled_run(["-m", "tests.checkpoint.crash_writer", str(checkpoint)], folder, lane) as (run, writer, log):
        stalled = [(f.step, f.complete) for f in list_step_folders(checkpoint)]
        assert any(p.suffix == ".distcp" for p in (checkpoint / "step-000003").iterdir()), \
            "no data written before the kill"
        os.kill(writer, signal.SIGKILL)
        run.wait(120)
        output = log.read_text()
    return {"checkpoint": checkpoint, "stalled": stalled, "output": output}


@pytest.mark.slow  # the writer process starts from scratch (~4 s), ahead of the test
@pytest.mark.run_ahead(job=kill_the_writer)
def test_killing_the_writer_process_midway_keeps_the_previous_checkpoint_loadable(ran_ahead):
    stalled, output = ran_ahead["stalled"], ran_ahead["output"]
    assert stalled == [(2, True), (3, False)]
    assert "SAVE FAILED: saving" in output and "the latest complete checkpoint is still step-000002" in output, output
    *_, state, manager, _, _ = make_run("single", ran_ahead["checkpoint"])
    assert manager.load() == 2 and state.step == 2
