"""A job killed in the middle of a save, in every save mode, loses nothing.

(The separate writer process of async_with_pinned_mem killed alone, with the training process
going on, is covered by tests/checkpoint/test_crash_safety.py.)
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from kenotron.checkpoint import list_step_folders
from kenotron.checkpoint.folders import STAMP_NAME
from tests.ahead import Lane
from tests.checkpoint.tiny import make_run, run_layout
from tests.stalled_run import stalled_run


def kill_during_save(mode: str) -> Callable[[Path, Lane], Path]:
    """The `run_ahead` job (tests/ahead.py) of `mode`: a training run (stalled_save.py) saves step
    2, stalls in the save of step 3 and is killed there with its writer, if another process; ~2-5 s
    of imports and waiting, ahead of the test. Gives the checkpoint folder it left."""
    def job(folder: Path, lane: Lane) -> Path:
        checkpoint = folder / "ckpt"
        with stalled_run(["-m", "tests.faults.stalled_save", mode, str(checkpoint)], folder, lane) as (run, stalled, _):
            for pid in {run.pid, stalled}:  # the training process and, if another, the writer
                os.kill(pid, signal.SIGKILL)
            run.wait(timeout=60)
        return checkpoint
    job.__name__ = f"kill_during_save_{mode}"
    return job


MODES = ["disabled", "async", "async_with_pinned_mem"]


@pytest.mark.slow  # a training process saves twice, its writer process starts from scratch (ahead of the test)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.run_ahead(job=kill_during_save(m))) for m in MODES],
                         ids=MODES)
def test_killing_the_job_during_a_save_keeps_the_previous_checkpoint(tmp_path, mode, ran_ahead):
    folder = tmp_path / "ckpt"
    shutil.copytree(ran_ahead, folder)  # the resumed run below writes: into the test's own folder
    interrupted = folder / "step-000003"
    assert [(f.step, f.complete) for f in list_step_folders(folder)] == [(2, True), (3, False)]
    assert (interrupted / STAMP_NAME).is_file() and any(p.suffix == ".distcp" for p in interrupted.iterdir())
    *_, state, manager, _, _ = make_run("single", folder)
    assert manager.load() == 2 and state.step == 2
    # The killed save is kenotron's own debris: the next save past it removes it.
    run_layout("single", folder, until=4, save_at=(4,), load=True)
    assert [(f.step, f.complete) for f in list_step_folders(folder)] == [(2, True), (4, True)]
