"""A rank's failure as one line: collective timeouts and vanished peers, and where the traceback goes.

A collective that times out, or whose peer went away, raises deep inside gloo or NCCL: its
traceback (60 lines) tells the user nothing the line below does not, and the rank that raised it
is usually not the one at fault. So such a failure ends in one line naming the timeout setting
and what the watchdog found before (the rank that stopped or waits for its loader, added to the
exception as a note by the trainer); the traceback goes to the run's log folder for whoever
debugs the library.

    line = collective_failure_line(exc, timeout_s)   # None: not a collective failure
    where = keep_traceback(exc, dump_folder, rank)   # <dump_folder>/logs/rank1_traceback.log
"""

from __future__ import annotations

import traceback
from pathlib import Path

TIMEOUT_MARKERS = ("Timed out waiting", "Application timeout caused pair closure",
                   "Watchdog caught collective operation timeout", "wait timeout after")
"""Texts of gloo's, NCCL's and the store's timeout errors (torch 2.11 and 2.13)."""
PEER_GONE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                     "NCCL communicator was aborted")
"""Texts of a collective whose peer process ended."""
WATCHDOG_NOTE = "before that the watchdog found: "
"""How the trainer's note with the watchdog's finding begins (train/trainer.py)."""


def watchdog_finding(exc: BaseException) -> str:
    """The watchdog's finding noted on `exc` ("" when none)."""
    for note in getattr(exc, "__notes__", ()):
        if note.startswith(WATCHDOG_NOTE):
            return note.removeprefix(WATCHDOG_NOTE)
    return ""


def collective_failure_line(exc: BaseException, timeout_s: float) -> str | None:
    """The one line for a collective that timed out or lost its peer; None for any other error."""
    text = str(exc)
    finding = watchdog_finding(exc)
    if any(marker in text for marker in TIMEOUT_MARKERS):
        what = (f"a collective timed out after {timeout_s:g} s (parallelism.collective_timeout_s): another rank "
                f"stopped answering")
    elif any(marker in text for marker in PEER_GONE_MARKERS):
        what = "a collective lost its peer: another rank ended first (its own line says why)"
    else:
        return None
    return f"{what}; {WATCHDOG_NOTE}{finding}" if finding else what


def keep_traceback(exc: BaseException, dump_folder: str | Path, rank: int) -> Path | None:
    """Write `exc`'s traceback to `<dump_folder>/logs/rank<rank>_traceback.log`; None if that fails."""
    path = Path(dump_folder) / "logs" / f"rank{rank}_traceback.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return path
