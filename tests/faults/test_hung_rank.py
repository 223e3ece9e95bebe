"""A rank that stops (SIGSTOP) is named by the watchdog long before the collective timeout ends the job."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.ahead import Lane
from tests.faults.launch import kill_job, rank_pids, start_job, wait_for_line

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the ranks")


def stop_a_rank(tmp_path: Path, lane: Lane) -> tuple[int, str, float, str, float, str]:
    """Two ranks train, rank 1 is stopped, and the job's lines about it are read until the
    collective timeout ends it: ~20 s, mostly waiting, run ahead of the test (tests/ahead.py).
    Returns the stopped rank's pid, the warning line and when it came, the last line and when it
    came (seconds after the stop), and the job's output."""
    job = start_job(2, tmp_path, ["--training.steps", "100000", "--parallelism.collective_timeout_s", "12"])
    seen: list[str] = []
    try:
        with lane.killed_at_stop(lambda: kill_job(job)):
            wait_for_line(job, "step      3/100000 ", 240, seen)
            victim = rank_pids(job.pid)[1]
            os.kill(victim, signal.SIGSTOP)
            stopped_at = time.monotonic()
            warning = wait_for_line(job, "no progress for", 60, seen)
            named_after = time.monotonic() - stopped_at
            # One line for gloo's "Timed out ..." or "Application timeout caused pair closure" (runtime/rank_failure.py).
            last = wait_for_line(job, "kenotron: a collective timed out after 12 s", 60, seen)
            timed_out_after = time.monotonic() - stopped_at
    finally:
        output = "".join(seen) + kill_job(job)
    return victim, warning, named_after, last, timed_out_after, output


@pytest.mark.slow  # two ranks start from scratch and wait out a 12 s timeout (~20 s, in the background lane)
@pytest.mark.run_ahead(job=stop_a_rank)
def test_a_stopped_rank_is_named_before_the_collective_timeout_ends_the_job(ran_ahead):
    victim, warning, named_after, last, timed_out_after, output = ran_ahead
    # Named by its pid, or (stopped before its first heartbeat: a fast start) as silent since the start.
    assert (re.search(rf"rank 1 \(pid {victim} on .*\) has sent no heartbeat for \d+ s", warning)
            or "rank 1 has sent no heartbeat since the job started" in warning), warning
    assert "collective timeout (parallelism.collective_timeout_s=12) ends the job in about" in warning
    assert named_after < 10 and named_after < timed_out_after, output
    assert timed_out_after < 40, f"the timeout took {timed_out_after:.0f} s, not ~12 s:\n{output}"
    assert "; before that the watchdog found: rank 1 " in last, output
    assert "unbound_buffer" not in output, output  # gloo's traceback went to the run's logs
