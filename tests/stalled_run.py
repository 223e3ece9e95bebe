"""A training process stopped at a chosen point, for the tests that kill it there: the scripts run
through `stalled_run` (tests/checkpoint/crash_writer.py, tests/faults/stalled_save.py) write the pid
of the process that stalls (their own, or their checkpoint writer's) to the file STALL_FLAG names
and sleep there until killed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from tests.ahead import Lane, kill_session
from tests.fork_server import ForkedProcess, start_python


@contextlib.contextmanager
def stalled_run(argv: list[str], folder: Path, lane: Lane) -> Iterator[tuple[ForkedProcess, int, Path]]:
    """`python *argv` (start_python) with STALL_FLAG in `folder`, once it has stalled: (the run, the
    stalled pid, the run's log). The run's session is killed if the lane stops meanwhile; on exit
    neither the run nor the stalled process is left behind, whatever failed."""
    flag, log = folder / "stalled.pid", folder / "run.txt"
    run = start_python(argv, log, {"STALL_FLAG": str(flag)})
    try:
        with lane.killed_at_stop(lambda: kill_session(run.pid)):  # the run leads its session, a writer is in it
            deadline = time.monotonic() + 120
            while not (flag.is_file() and flag.read_text()):
                assert run.poll() is None, f"the run ended before the stall:\n{log.read_text()}"
                assert time.monotonic() < deadline, "the run never reached the stall"
                time.sleep(0.1)
            yield run, int(flag.read_text()), log
    finally:
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(60)
        if flag.is_file() and flag.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(flag.read_text()), signal.SIGKILL)
