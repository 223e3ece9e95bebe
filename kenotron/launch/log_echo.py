"""The watchdog's warnings of the ranks whose output the console does not show, echoed on it.

With several ranks, the console shows only `log_ranks` (rank 0); the others write to their files
under the run's log folder. When rank 0 itself stops (SIGSTOP, swapped out), the rank that names
it is rank 1, in its file: so the launcher follows the hidden ranks' files and repeats each line
of the watchdog (runtime/watchdog.py marks them with WATCHDOG_MARK) on the console, as

    kenotron: rank 1: watchdog: no progress for 5 s (...): rank 0 (pid 4242 on node7) has sent no heartbeat ...
"""

from __future__ import annotations

import glob
import os
import sys
import threading
from typing import TextIO

WATCHDOG_MARK = "] watchdog: "
"""What sets the watchdog's lines apart in a rank's log (after the console format's time)."""


class LogEcho:
    """A thread that follows the newest stderr.log of each of `local_ranks` under `log_dir` and
    writes their watchdog lines to `out`. `one_node`: local ranks are the job's ranks (on several
    nodes a rank's global number is settled by the rendezvous, unknown here: it says "local rank")."""

    def __init__(self, log_dir: str, local_ranks: list[int], *, one_node: bool = True, out: TextIO | None = None,
                 interval_s: float = 0.5) -> None:
        self.log_dir = log_dir
        self.local_ranks = local_ranks
        self.one_node = one_node
        self.out = out if out is not None else sys.stderr
        self.interval_s = interval_s
        self._offsets: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kenotron-log-echo", daemon=True)

    def start(self) -> LogEcho:
        if self.local_ranks:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
        self.poll()  # what was written just before the end

    def poll(self) -> None:
        """Echo the watchdog lines written since the last poll."""
        for local_rank in self.local_ranks:
            found = glob.glob(os.path.join(self.log_dir, "*", "attempt_*", str(local_rank), "stderr.log"))
            if not found:
                continue
            path = max(found, key=os.path.getmtime)
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
            self._offsets[path] = offset + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                mark = line.find(WATCHDOG_MARK)
                if mark >= 0:
                    text = line[mark + len(WATCHDOG_MARK):]
                    who = f"rank {local_rank}" if self.one_node else f"local rank {local_rank} of this node"
                    print(f"kenotron: {who}: watchdog: {text}", file=self.out, flush=True)
