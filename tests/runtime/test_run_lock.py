"""One live job per run folder: a second job on a folder in use stops at once, naming the holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kenotron.runtime.run_lock import RunFolderBusyError, RunFolderLock
from kenotron.train.__main__ import main

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; from kenotron.runtime.run_lock import RunFolderLock; RunFolderLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def held_by_another_process(tmp_path):
    """tmp_path/run locked by another live process (killed with SIGKILL at the end)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        yield tmp_path / "run", holder
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_held_by_a_live_process_is_refused_and_freed_when_it_dies(held_by_another_process):
    folder, holder = held_by_another_process
    with pytest.raises(RunFolderBusyError, match=rf"job.dump_folder='.*run' is in use by another live job \(pid "
                                                 rf"{holder.pid} on .*\); wait for it to end, stop it, or give"):
        RunFolderLock(folder).acquire()
    os.kill(holder.pid, signal.SIGKILL)  # however it dies, the kernel drops the lock
    holder.wait()
    RunFolderLock(folder).acquire().release()


def test_a_training_job_on_a_folder_in_use_stops_with_one_line_before_building_anything(held_by_another_process,
                                                                                       capsys):
    folder, holder = held_by_another_process
    assert main(["--training.steps", "1", "--job.dump_folder", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"is in use by another live job (pid {holder.pid}" in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_the_same_process_may_open_its_own_folder_twice(tmp_path):
    first = RunFolderLock(tmp_path).acquire()
    second = RunFolderLock(tmp_path).acquire()  # a notebook that builds a second trainer
    second.release()
    first.release()
