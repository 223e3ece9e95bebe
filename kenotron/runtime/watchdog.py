"""A watchdog that names the rank which stopped making progress, long before the collective timeout.

When one rank hangs (a stopped or swapped-out process, a deadlock, a dead disk), every other
rank waits in its next collective until `parallelism.collective_timeout_s` runs out, silently,
and the launcher then blames whichever healthy rank timed out first. Here every rank runs a
thread that, every few seconds, publishes a heartbeat in the job's rendezvous store: a counter,
the steps it has completed, its host and pid. When a rank's own progress has stalled for
`warn_after_s`, it reads everyone's heartbeat and names

- ranks whose heartbeat stopped changing (the whole process stopped: SIGSTOP, swapped out, a
  deadlock holding Python's lock), and
- ranks waiting for their data loader (a loader thread stuck on a file, a socket, a lock):
  each heartbeat says what the rank is doing (`activity`), and a rank whose own main thread waits
  for its loader says so itself, naming the loader,
- ranks behind in completed steps while alive (stuck or slow inside the step),

from the lowest-numbered healthy rank only, with the time left before the timeout ends the job.
All ranks stalled alike (a long compilation, a save) name nobody and stay quiet.

The collective timeout is the backend's to enforce, and gloo does. NCCL may not: with a peer
stopped (SIGSTOP) its watchdog can wait on kernels that never finish (docs/performance.md, the
hung-rank test on NCCL). So a rank whose progress has stalled for the timeout plus
a grace (`end_grace_s`), with a suspect named, ends the job itself: the same one line as a
collective timeout, then `end_job` (by default: record it for the launcher and exit).

A rank may stop before its first heartbeat (a fast start: its thread's first beat comes
`beat_s` after it starts, by when a tiny model has trained a few steps). Its key is then missing,
and reading a missing key blocks until the store's timeout (the collective timeout) and raises:
the watchdog would name nobody, die, and hold the store's one connection meanwhile. So every
heartbeat is published at once when the thread starts, and a report reads only the keys that
exist (`store.check`); a rank without one is named like a stopped rank.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kenotron.runtime.rank_failure import WATCHDOG_NOTE
from kenotron.runtime.worker_guard import report_failure

logger = logging.getLogger("kenotron")

KEY_PREFIX = "kenotron/heartbeat/"
WAITING_FOR_DATA = "data"
"""The activity of a rank whose main thread waits for its data loader's next batch."""


@dataclass
class _Seen:
    value: str
    since: float
    """When this rank's heartbeat last changed, by this process's clock."""
    changed: bool = False
    """Seen changing during this stall: the rank is alive (one look cannot tell)."""


def default_end_grace_s(timeout_s: float) -> float:
    """Seconds past the collective timeout left to the backend before the watchdog ends the job."""
    return max(15.0, timeout_s / 4)


def end_process(line: str) -> None:
    """The default `end_job`: the one line on stderr and for the launcher, then exit 1 at once (the
    main thread is stuck in a collective that will not return)."""
    report_failure(line)
    os._exit(1)


def timings(timeout_s: float) -> tuple[float, float]:
    """(seconds between heartbeats, seconds of stalled progress before the first warning)."""
    warn_after = max(min(60.0, timeout_s / 4), 1.0)
    return max(min(5.0, warn_after / 4), 0.25), warn_after


class ProgressWatchdog:
    """Heartbeats through `store` and warnings about stalled ranks (module docstring)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float, progress: Callable[[], int],
                 *, setting: str = "parallelism.collective_timeout_s", activity: Callable[[], str] | None = None,
                 loader: str = "the data loader", end_job: Callable[[str], None] = end_process,
                 end_grace_s: float | None = None) -> None:
        """`activity` says what this rank's main thread does (WAITING_FOR_DATA, or any one word);
        `loader` names the data loader in the warnings (e.g. the config's data.loader); `end_job`
        is called with the line once the stall outlasts the timeout by `end_grace_s`."""
        self.end_job = end_job
        self.end_grace_s = default_end_grace_s(timeout_s) if end_grace_s is None else end_grace_s
        self.store = store
        self.activity = activity
        self.loader = loader
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.progress = progress
        self.setting = setting
        self.beat_s, self.warn_after_s = timings(timeout_s)
        self.stale_after_s = max(3 * self.beat_s, 2.0)
        self.diagnosis = ""
        """The latest finding about stalled ranks ("" while none), for the error at a timeout."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[int, _Seen] = {}
        self._published: set[int] = set()
        """Ranks whose heartbeat key exists in the store."""
        self._host = socket.gethostname()

    def start(self) -> ProgressWatchdog:
        self._thread = threading.Thread(target=self._run, name="kenotron-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.beat_s + 1)

    def _run(self) -> None:
        beat = 0
        last_step, last_change, last_warning = self._progress(), time.monotonic(), 0.0
        if not self._beat(beat, last_step):  # at once: the others see this rank alive from the start
            return
        while not self._stop.wait(self.beat_s):
            beat += 1
            step = self._progress()
            now = time.monotonic()
            if step != last_step:  # progress: a later stall is judged on fresh observations
                last_step, last_change, self.diagnosis = step, now, ""
                self._seen.clear()
            if not self._beat(beat, step):
                return
            due = now - last_change >= self.warn_after_s and now - last_warning >= self.warn_after_s
            try:
                if due and self._report(step, now - last_change):
                    last_warning = now
            except Exception as exc:  # noqa: BLE001  (as in _beat)
                logger.debug("watchdog: the store is not reachable (%s); stopping the heartbeat", exc)
                return
            if self.diagnosis and now - last_change >= self.timeout_s + self.end_grace_s:
                self.end_job(self._ending_line(now - last_change))
                return

    def _ending_line(self, stalled_s: float) -> str:
        """The collective timeout's line (runtime/rank_failure.py), saying the watchdog ended the job."""
        return (f"kenotron: a collective timed out after {self.timeout_s:g} s ({self.setting}): another rank stopped "
                f"answering, and the backend had not ended the job {stalled_s - self.timeout_s:.0f} s later, so "
                f"rank {self.rank}'s watchdog did; {WATCHDOG_NOTE}{self.diagnosis}")

    def _beat(self, beat: int, step: int) -> bool:
        """Publish this rank's heartbeat; False when the store is gone."""
        try:
            self.store.set(f"{KEY_PREFIX}{self.rank}", f"{beat} {step} {self._host} {os.getpid()} {self._activity()}")
            return True
        # The store going away (the job is ending, the agent died) must never kill training.
        except Exception as exc:  # noqa: BLE001
            logger.debug("watchdog: the store is not reachable (%s); stopping the heartbeat", exc)
            return False

    def _activity(self) -> str:
        try:
            return str(self.activity()) if self.activity is not None else "-"
        except Exception:  # noqa: BLE001  (as _progress)
            return "-"

    def _progress(self) -> int:
        try:
            return int(self.progress())
        except Exception:  # noqa: BLE001  (a trainer still being built has no step yet)
            return -1

    def _report(self, step: int, stalled_s: float) -> bool:
        """Read everyone's heartbeat; log (lowest healthy rank only) and return whether any rank is suspect."""
        if self._activity() == WAITING_FOR_DATA:
            # This rank is the one the others wait for, and alive to say so: it names itself and its loader.
            self.diagnosis = (f"rank {self.rank} (pid {os.getpid()} on {self._host}) has waited {stalled_s:.0f} s for its "
                              f"data loader ({self.loader}) to give the batch after step {step}: the loader is stuck "
                              f"or slow")
            logger.warning("watchdog: %s. If nothing changes, the collective timeout (%s=%g) ends the job in about %.0f s",
                           self.diagnosis, self.setting, self.timeout_s, max(self.timeout_s - stalled_s, 0))
            return True
        values = self._heartbeats()
        now = time.monotonic()
        stopped, behind = [], []
        for r, value in enumerate(values):
            seen = self._seen.get(r)
            if seen is None:
                self._seen[r] = seen = _Seen(value, now)
            elif seen.value != value:
                seen.value, seen.since, seen.changed = value, now, True
            _, their_step, host, pid, activity = (value.split(" ") + ["?"] * 5)[:5]
            quiet_s = now - seen.since
            if r == self.rank:
                continue
            if quiet_s >= self.stale_after_s and not value:
                stopped.append(f"rank {r} has sent no heartbeat since the job started ({quiet_s:.0f} s or more "
                               f"watched): the process is stopped, swapped out or deadlocked")
            elif quiet_s >= self.stale_after_s:
                stopped.append(f"rank {r} (pid {pid} on {host}) has sent no heartbeat for {quiet_s:.0f} s or more, its "
                               f"last one at step {their_step}: the process is stopped, swapped out or deadlocked")
            elif seen.changed and activity == WAITING_FOR_DATA:
                behind.append(f"rank {r} (pid {pid} on {host}) is alive but waiting for its data loader ({self.loader}) "
                              f"after step {their_step}: the loader is stuck or slow")
            elif (seen.changed and their_step.lstrip("-").isdigit()
                  and int(their_step) < step):
                behind.append(f"rank {r} (pid {pid} on {host}) is alive but still at step {their_step}: it is stuck "
                              f"or slow inside the step")
        suspects = stopped + behind
        if not suspects:
            return False
        self.diagnosis = "; ".join(suspects)
        healthy = [r for r in range(self.world_size) if not any(s.startswith(f"rank {r} ") for s in suspects)]
        if healthy and healthy[0] == self.rank:
            left = max(self.timeout_s - stalled_s, 0)
            logger.warning(
                "watchdog: no progress for %.0f s (rank %d has completed step %d): %s. If nothing changes, the collective "
                "timeout (%s=%g) ends the job in about %.0f s", stalled_s, self.rank, step, self.diagnosis,
                self.setting, self.timeout_s, left,
            )
        return True

    def _heartbeats(self) -> list[str]:
        """Every rank's latest heartbeat, "" for a rank that has published none. Only keys known to
        exist are read: reading a missing one blocks until the store's timeout (module docstring)."""
        keys = [f"{KEY_PREFIX}{r}" for r in range(self.world_size)]
        for r in range(self.world_size):
            if r not in self._published and self.store.check([keys[r]]):
                self._published.add(r)  # a heartbeat key is never deleted while the job runs
        ranks = sorted(self._published)
        read = self.store.multi_get([keys[r] for r in ranks]) if ranks else []
        values = dict(zip(ranks, (v.decode() if isinstance(v, bytes) else str(v) for v in read), strict=True))
        return [values.get(r, "") for r in range(self.world_size)]


def default_store() -> Any | None:
    """The job's rendezvous store (torchrun's, or the one init_process_group was given), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()  # private in torch 2.11 and 2.13
    except Exception:  # noqa: BLE001  (no default group, or the private name moved)
        return None


def start_watchdog(rank: int, world_size: int, timeout_s: float, progress: Callable[[], int], *,
                   activity: Callable[[], str] | None = None, loader: str = "the data loader") -> ProgressWatchdog | None:
    """A running watchdog for a multi-rank job with a rendezvous store; None otherwise."""
    store = default_store() if world_size > 1 else None
    if store is None:
        return None
    return ProgressWatchdog(store, rank, world_size, timeout_s, progress, activity=activity, loader=loader).start()
