"""Where the seconds of a rejoin go: each phase of a replica group's start, and of a survivor's
failure, as one log line with its wall-clock time, and the reader that turns those lines into
seconds per phase (scripts/bench_fault_tolerance.py prints them in its JSON).

A line, written by rank 0 of a group (the other ranks log warnings only), only at a group's
start and when a step fails or the groups in the quorum change, never on a plain step:

    fault tolerance timeline | group 1 | quorum_asked at 1764241234.567 | step 0

The synchronous mode logs every phase; under DiLoCo (fault_tolerance.sync_every > 1) torchft's
hooks run the quorums after the first, so a group logs its start up to its first quorum only.

No torch at import: the bench reads the logs without it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("kenotron")

START_PHASES: dict[str, str] = {
    "process_start": "the rank's process started (a torchrun restart, or the first start)",
    "imports_done": "the rank program imported torch, torchft and kenotron",
    "model_built": "config resolved, process group and device ready, model built and parallelized",
    "manager_ready": "torchft's process group and manager made (the lighthouse reached)",
    "run_state_ready": "optimizer, schedule and loader made (the group's checkpoint read already only under DiLoCo)",
    "quorum_asked": "the first quorum asked of the lighthouse",
    "quorum_granted": "the quorum granted (a group behind the others starts fetching a peer's state here)",
    "live_state_received": "a peer's live state received over torchft's transport (bytes, seconds)",
    "live_state_loaded": "the live state loaded into the model, optimizer, schedule and loader",
    "quorum_done": "the first quorum returned (the groups in it)",
    "checkpoint_loaded": "no peer ahead: the group's own checkpoint loaded (then its second quorum)",
    "first_step_done": "this process's first step done (the all-reduce with the others in it)",
}
"""A group's start, in the order it happens: a group behind a peer takes its live state and reads
no checkpoint; one that is not takes no live state (checkpoint_loaded: only where it has one)."""

SURVIVOR_PHASES: dict[str, str] = {
    "step_failed": "a step did not commit (the error, and how long its all-reduce waited)",
    "quorum_after_failure": "the next quorum after a failed step returned (the groups in it, seconds)",
    "live_state_sent": "this group staged its live state for a recovering peer (bytes, seconds)",
    "peer_joined": "a quorum with more groups than the previous step's returned",
    "peer_left": "a quorum with fewer groups than the previous step's returned, no step having failed",
}
"""What a surviving group logs when a peer dies and comes back."""

LINE = re.compile(r"fault tolerance timeline \| group (\d+) \| (\w+) at (\d+(?:\.\d+)?)(?: \| (.*))?")


@dataclass(frozen=True)
class Mark:
    """One line of the timeline."""

    group: int
    """The replica group that logged it."""
    phase: str
    """A key of START_PHASES or SURVIVOR_PHASES."""
    at: float
    """Wall-clock time (time.time())."""
    detail: str = ""
    """What the phase carries (participants, bytes, the error)."""


class RejoinTimeline:
    """The marks of one process of replica group `group` (module docstring)."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.seen: set[str] = set()

    def mark(self, phase: str, detail: str = "", at: float | None = None) -> None:
        """Log `phase` at `at` (now when None)."""
        self.seen.add(phase)
        when = time.time() if at is None else at
        logger.info("fault tolerance timeline | group %d | %s at %.3f%s", self.group, phase, when,
                    f" | {detail}" if detail else "")

    def first(self, phase: str, detail: str = "") -> None:
        """Log `phase` unless this process logged it already."""
        if phase not in self.seen:
            self.mark(phase, detail)


def process_start_time() -> float | None:
    """This process's start as a wall-clock time (Linux /proc, to ~10 ms), or None elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of proc(5), starttime: clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def parse_marks(text: str) -> list[Mark]:
    """Every timeline line of a log, in the order logged."""
    return [Mark(int(m[1]), m[2], float(m[3]), (m[4] or "").strip()) for m in LINE.finditer(text)]


def rejoin_breakdown(restarted: list[Mark], survivor: list[Mark], killed_at: float) -> dict[str, object]:
    """Seconds per phase of a rejoin: `restarted` are the marks the killed group's new process
    logged, `survivor` the surviving group's marks after the kill, `killed_at` the kill's time.

    `phases_s` has each start phase's seconds since the previous one (the first since the
    kill), `since_kill_s` each phase's seconds since the kill, `survivor_since_kill_s` the same
    for the survivor's first mark of each phase, and `details` what the marks carry."""
    phases: dict[str, float] = {}
    since_kill: dict[str, float] = {}
    details: dict[str, str] = {}
    previous = killed_at
    for mark in sorted(restarted, key=lambda m: m.at):
        if mark.phase not in START_PHASES or mark.phase in phases:
            continue
        phases[mark.phase] = round(mark.at - previous, 3)
        since_kill[mark.phase] = round(mark.at - killed_at, 3)
        previous = mark.at
        if mark.detail:
            details[mark.phase] = mark.detail
    survivor_since: dict[str, float] = {}
    for mark in survivor:
        if mark.at >= killed_at and mark.phase in SURVIVOR_PHASES and mark.phase not in survivor_since:
            survivor_since[mark.phase] = round(mark.at - killed_at, 3)
            if mark.detail:
                details[f"survivor_{mark.phase}"] = mark.detail
    return {"phases_s": phases, "since_kill_s": since_kill, "survivor_since_kill_s": survivor_since,
            "details": details}
