"""The launcher repeats on the console the watchdog's lines of the ranks it does not show, and
nothing else of their logs (launch/log_echo.py)."""

from __future__ import annotations

import io

from kenotron.launch.log_echo import LogEcho


def rank_log(log_dir, local_rank: int):
    path = log_dir / "job-id" / "attempt_0" / str(local_rank) / "stderr.log"
    path.parent.mkdir(parents=True)
    return path


def test_the_watchdog_lines_of_a_hidden_rank_are_echoed_once_each_and_nothing_else(tmp_path):
    log = rank_log(tmp_path, 1)
    out = io.StringIO()
    echo = LogEcho(str(tmp_path), [1], out=out)
    log.write_text("[kenotron 10:00:00] some rank-1 warning\n"
                   "[kenotron 10:00:05] watchdog: no progress for 5 s (rank 1 has completed step 3): rank 0 (pid 7 on "
                   "h) has sent no heartbeat for 2 s or more\n[kenotron 10:00:08] watchdog: half a li")
    echo.poll()
    with log.open("a") as f:
        f.write("ne\n")
    echo.poll()
    echo.poll()
    assert out.getvalue().splitlines() == [
        ("kenotron: rank 1: watchdog: no progress for 5 s (rank 1 has completed step 3): rank 0 (pid 7 on h) has sent "
         "no heartbeat for 2 s or more"),
        "kenotron: rank 1: watchdog: half a line",
    ]


def test_on_several_nodes_the_rank_is_named_as_a_local_rank(tmp_path):
    rank_log(tmp_path, 2).write_text("[kenotron 10:00:05] watchdog: no progress for 5 s\n")
    out = io.StringIO()
    LogEcho(str(tmp_path), [1, 2], one_node=False, out=out).poll()
    assert out.getvalue() == "kenotron: local rank 2 of this node: watchdog: no progress for 5 s\n"
