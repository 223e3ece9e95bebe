"""What a training process does about its own end: signals, its launcher's death, its last word.

    guard = WorkerGuard.install()     # first thing in a training process
    ...train...                       # Ctrl-C / SIGTERM raise StopRequested once, in the main thread
    report_failure("kenotron: config error: ...", exit_code=2)

- **Stopping.** The first SIGINT or SIGTERM raises `StopRequested` (a KeyboardInterrupt) in
  the main thread, so `finally` blocks run and a save in flight can finish. Later signals are
  ignored, and a timer ends the process `grace_s` seconds after the first one, so a stop that
  hangs (a peer gone in the middle of a collective) still ends.
- **The launcher's death.** torchrun starts every worker in a session of its own, so a launcher
  killed with SIGKILL would leave its workers training on. On Linux the kernel sends the worker
  SIGTERM when its parent dies (`PR_SET_PDEATHSIG`), and a thread watches the parent id as well.
- **The last word.** `report_failure` prints the one-line error and also writes it where
  torchrun's error file is (`TORCHELASTIC_ERROR_FILE`), with the time to the microsecond, so the
  launcher can name the rank that failed first even when that rank's output is not shown.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Set by torchrun for each worker: where its failure is recorded for the agent."""

_PR_SET_PDEATHSIG = 1


class StopRequested(KeyboardInterrupt):
    """The process was asked to stop (Ctrl-C, SIGTERM from its launcher or the scheduler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code_of(stop: KeyboardInterrupt) -> int:
    """128 + the signal number, as shells report a process ended by it (130 for a plain Ctrl-C)."""
    return stop.exit_code if isinstance(stop, StopRequested) else 128 + signal.SIGINT


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux; elsewhere, or where prctl fails, the
    parent watcher alone does it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    # The parent may have died before the request was made: then no signal will ever come.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class WorkerGuard:
    """Signal handling of one training process (module docstring); `install()` makes one."""

    grace_s: float = 25.0
    """Seconds between the first stop signal and the forced exit."""
    stopping: threading.Event = field(default_factory=threading.Event)
    _uninstalled: threading.Event = field(default_factory=threading.Event)
    _previous: dict[int, Any] = field(default_factory=dict)

    @classmethod
    def install(cls, grace_s: float = 25.0, *, watch_parent: bool = True) -> WorkerGuard:
        guard = cls(grace_s)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                guard._previous[signum] = signal.signal(signum, guard._on_signal)
            # A blocked signal mask is inherited through fork and exec: a launcher started with
            # SIGTERM blocked would pass on ranks that never hear their stop.
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if watch_parent:
            parent = os.getppid()
            if parent != 1:
                _die_with_parent(parent)
                # Also where the kernel's signal is promised: a CI run saw ranks outlive a killed
                # launcher once (2026-11-27, not reproduced); the thread costs one wake-up a second.
                threading.Thread(target=guard._watch_parent, args=(parent,), daemon=True).start()
        return guard

    def uninstall(self) -> None:
        self._uninstalled.set()  # the parent watcher ends
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping.is_set():
            return  # already stopping: the first signal's clean-up goes on
        self.stopping.set()
        timer = threading.Timer(self.grace_s, self._force_exit, args=(signum,))
        timer.daemon = True
        timer.start()
        raise StopRequested(signum)

    def _force_exit(self, signum: int) -> None:
        print(
            f"kenotron: still stopping {self.grace_s:.0f} s after {signal.Signals(signum).name}; exiting now "
            f"(a checkpoint still being written is abandoned: it has no completion marker and is never loaded)",
            file=sys.stderr, flush=True,
        )
        os._exit(128 + signum)

    def _watch_parent(self, parent: int) -> None:
        while not self._uninstalled.wait(1.0):
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return


def report_failure(line: str, *, kind: str = "error") -> None:
    """Print the one-line error on stderr and record it for the launcher (torchrun's error file).

    `kind` tells the launcher how to rank it: "config" and "error" are causes, "interrupted"
    is a process that was told to stop.
    """
    try:
        print(line, file=sys.stderr, flush=True)
        printed = True
    except OSError:  # stderr is a log file on a full disk (torchrun's --tee): the launcher says it instead
        printed = False
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    now = time.time()
    # torchrun reads "message" and "timestamp"; the "kenotron" entry is read by kenotron's launcher.
    record = {"message": line, "timestamp": int(now),
              "kenotron": {"line": line, "kind": kind, "time": now, "printed": printed}}
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
