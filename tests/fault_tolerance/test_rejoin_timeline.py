"""The rejoin timeline's reader (kenotron/fault_tolerance/rejoin_timeline.py), on lines recorded
from a CPU kill of group 1 of two (tests/fault_tolerance/groups.py's harness), as the bench
(scripts/bench_fault_tolerance.py) reads them from the launchers' output."""

from __future__ import annotations

import logging
import time

import pytest

from kenotron.fault_tolerance.rejoin_timeline import (
    START_PHASES,
    RejoinTimeline,
    parse_marks,
    process_start_time,
    rejoin_breakdown,
)

IMPORTED_AT = time.time()
KILLED_AT = 1795780035.395
RESTARTED = """\
[kenotron 11:47:19] fault tolerance timeline | group 1 | process_start at 1795780036.479
[kenotron 11:47:19] fault tolerance timeline | group 1 | imports_done at 1795780036.811
[kenotron 11:47:19] fault tolerance timeline | group 1 | model_built at 1795780039.886
[kenotron 11:47:20] fault tolerance timeline | group 1 | manager_ready at 1795780040.307
[kenotron 11:47:20] fault tolerance timeline | group 1 | run_state_ready at 1795780040.342 | step 0
[kenotron 11:47:20] fault tolerance timeline | group 1 | quorum_asked at 1795780040.342 | step 0
[kenotron 11:47:20] some other line of the run | step 3
[kenotron 11:47:20] fault tolerance timeline | group 1 | quorum_granted at 1795780040.511 | behind: fetching step 12 from replica rank 0
[kenotron 11:47:20] fault tolerance timeline | group 1 | live_state_received at 1795780040.552 | 8279992 bytes in 0.041 s
[kenotron 11:47:20] fault tolerance timeline | group 1 | live_state_loaded at 1795780040.607 | step 12
[kenotron 11:47:20] fault tolerance timeline | group 1 | quorum_done at 1795780040.608 | 2 group(s), this one replica rank 1, 0.265 s
[kenotron 11:47:21] fault tolerance timeline | group 1 | first_step_done at 1795780041.221 | step 13
"""
SURVIVOR = """\
[kenotron 11:47:08] fault tolerance timeline | group 0 | quorum_done at 1795780028.838 | 2 group(s), this one replica rank 0, 0.299 s
[kenotron 11:47:09] fault tolerance timeline | group 0 | first_step_done at 1795780029.597 | step 1
[kenotron 11:47:16] fault tolerance timeline | group 0 | step_failed at 1795780036.296 | step 6: all-reduce waited 0.996 s of 20 s; RuntimeError: Connection closed by peer [127.0.0.1]:19842.
[kenotron 11:47:16] fault tolerance timeline | group 0 | quorum_after_failure at 1795780036.902 | 1 group(s), this one replica rank 0, 0.600 s
[kenotron 11:47:20] fault tolerance timeline | group 0 | live_state_sent at 1795780040.516 | 8279992 bytes staged for replica rank(s) [1] at step 12 in 0.000 s
[kenotron 11:47:20] fault tolerance timeline | group 0 | peer_joined at 1795780040.519 | 2 group(s), this one replica rank 0, 0.024 s
"""


def test_the_breakdown_gives_each_phase_its_seconds_since_the_previous_and_since_the_kill():
    report = rejoin_breakdown(parse_marks(RESTARTED), parse_marks(SURVIVOR), KILLED_AT)
    phases, since = report["phases_s"], report["since_kill_s"]
    # every phase of a group behind its peer, in the order it happens (it reads no checkpoint)
    assert list(phases) == [p for p in START_PHASES if p != "checkpoint_loaded"]
    assert phases["process_start"] == pytest.approx(36.479 - 35.395)
    assert phases["model_built"] == pytest.approx(39.886 - 36.811)
    assert phases["live_state_received"] == pytest.approx(0.041)
    assert since["first_step_done"] == pytest.approx(41.221 - 35.395)
    assert sum(phases.values()) == pytest.approx(since["first_step_done"], abs=1e-6)
    assert report["details"]["live_state_received"] == "8279992 bytes in 0.041 s"


def test_the_survivor_counts_only_its_marks_after_the_kill():
    report = rejoin_breakdown(parse_marks(RESTARTED), parse_marks(SURVIVOR), KILLED_AT)
    assert report["survivor_since_kill_s"] == pytest.approx(
        {"step_failed": 0.901, "quorum_after_failure": 1.507, "live_state_sent": 5.121, "peer_joined": 5.124})
    assert report["details"]["survivor_step_failed"].startswith("step 6: all-reduce waited 0.996 s of 20 s")


def test_a_timeline_line_logged_is_read_back_with_its_phase_time_and_detail(caplog):
    timeline = RejoinTimeline(3)
    with caplog.at_level(logging.INFO, logger="kenotron"):
        timeline.mark("quorum_asked", "step 7", at=1234.5)
        timeline.first("first_step_done", "step 8")
        timeline.first("first_step_done", "step 9")  # once per process
    marks = parse_marks(caplog.text)
    assert [(m.group, m.phase, m.detail) for m in marks] == [(3, "quorum_asked", "step 7"),
                                                             (3, "first_step_done", "step 8")]
    assert marks[0].at == 1234.5


def test_this_process_started_before_this_module_was_imported_and_within_the_hour():
    started = process_start_time()
    if started is None:
        pytest.skip("no /proc here: the process start is not marked")
    assert IMPORTED_AT - 3600 < started <= IMPORTED_AT + 0.05  # /proc counts in clock ticks (10 ms)
