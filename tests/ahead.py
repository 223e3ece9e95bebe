"""Long processes run ahead of their tests, in one background lane.

Some tests wait 5-100 s for a process of their own and then check what it printed and left:
README's quick start and the examples' commands run as written, the wheel built and used, the
Triton-interpreter scripts, scripts/ and kenotron/tools/ cases that train in their own process.
Such a process needs a folder, not the test's process, so it need not wait for the test's turn.
A test marked `@pytest.mark.run_ahead(job=fn)` has `fn(folder, lane)` run when the session
starts, in one thread that runs the marked tests' functions one after the other while the
in-process tests run; the marked tests are moved to the end of the run, where their `ran_ahead`
fixture (tests/conftest.py) gives what `fn` returned (waiting for it) or raises what it raised.
Tests marked with the same function share its one run. Why it pays: most in-process tests run
one thread, so on CI's two cores the second core is idle for much of the session; the lane's
processes use it.

The functions run in a thread of the pytest process and touch no state of the test process: they
start a new interpreter with `lane.run` (in a session of its own, killed with its children if
pytest stops first; tests/test_suite_budget.py counts these calls as it counts subprocess's), or
a forked one through tests/fork_server.py, whose client serves two threads. One lane, not
several: two jobs at once would compete with the in-process tests for the same two cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MARKER = "run_ahead"
"""`@pytest.mark.run_ahead(job=fn)`: `fn(folder, lane)` runs ahead in the lane; the test reads its result."""


@dataclass(eq=False)
class Job:
    """One marked test's function, its folder and, once it ended, its outcome."""

    fn: Callable[[Path, Lane], Any]
    """The function that runs the command(s): `fn(folder, lane)`, starting each with `lane.run`."""
    folder: Path
    """A fresh folder of the session's temporary directory, the function's only place to write."""
    done: threading.Event = field(default_factory=threading.Event)
    """Set when the function returned or raised."""
    value: Any = None
    """What the function returned."""
    error: BaseException | None = None
    """What the function raised, re-raised in the test."""
    seconds: float = 0.0
    """How long the function ran."""


class Lane:
    """The background thread that runs the jobs in order; `stop` ends it and kills its processes."""

    def __init__(self, jobs: dict[str, Job]):
        self.jobs = jobs  # by test; tests marked with the same function share its one job
        self._stopped = False
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()  # started by `start`, not yet waited for
        self._kills: list[Callable[[], object]] = []  # what `stop` calls besides (see `killed_at_stop`)
        self.waited = 0.0  # seconds the tests spent waiting for their jobs
        self._thread = threading.Thread(target=self._work, name="kenotron-tests-run-ahead", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        for job in dict.fromkeys(self.jobs.values()):
            if self._stopped:
                job.error = RuntimeError("the session ended before this job ran")
            else:
                started = time.monotonic()
                try:
                    job.value = job.fn(job.folder, self)
                except BaseException as error:  # noqa: BLE001  (the test re-raises it)
                    job.error = error
                job.seconds = time.monotonic() - started
            job.done.set()

    def result(self, nodeid: str) -> Any:
        """What the job of test `nodeid` returned, once it ended; raises what it raised."""
        job = self.jobs[nodeid]
        started = time.monotonic()
        job.done.wait()
        self.waited += time.monotonic() - started
        if job.error is not None:
            raise job.error
        return job.value

    def summary(self) -> str:
        """One line for the end of the session: what ran ahead, and what the tests waited for it."""
        jobs = list(dict.fromkeys(self.jobs.values()))
        ran = sum(job.seconds for job in jobs)
        return (f"run ahead (tests/ahead.py): {len(jobs)} job{'s' * (len(jobs) != 1)}, {ran:.0f} s in the background; "
                f"their tests waited {self.waited:.0f} s for them")

    def start(self, args: list[str | Path], *, cwd: Path, env: dict[str, str],
              stderr: int = subprocess.PIPE) -> subprocess.Popen:
        """A `subprocess.Popen` of `args` (text stdout through a pipe; stderr too, or into stdout
        with `subprocess.STDOUT`) in a session of its own, which `stop` kills with its children
        until `wait` reaps it. For jobs that run processes side by side."""
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the session ended before {args[:3]} started")
            proc = subprocess.Popen([str(a) for a in args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=stderr, text=True, start_new_session=True)
            self._running.add(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float) -> tuple[str, str | None]:
        """`proc.communicate(timeout=timeout)` for a process of `start`: its stdout and stderr. At
        the timeout it is killed with its children, and TimeoutExpired raised."""
        try:
            return proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            proc.communicate()
            raise
        finally:
            with self._lock:
                self._running.discard(proc)

    def run(self, args: list[str | Path], *, cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        """subprocess's `run` of `args` with `capture_output=True, text=True`, through `start` and
        `wait`: killed with its children at the timeout (TimeoutExpired) or by `stop`."""
        proc = self.start(args, cwd=cwd, env=env)
        stdout, stderr = self.wait(proc, timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    @contextmanager
    def killed_at_stop(self, kill: Callable[[], object]) -> Iterator[None]:
        """While in it, `stop` also calls `kill`: for processes a job starts otherwise than by
        `start` (a helper's Popen), which would outlive a session ended midway."""
        with self._lock:
            self._kills.append(kill)
        try:
            yield
        finally:
            with self._lock:
                self._kills.remove(kill)

    def stop(self) -> None:
        """No job starts after this; the processes running now are killed with their children."""
        with self._lock:
            self._stopped = True
            for proc in self._running:
                kill_session(proc.pid)
            kills = list(self._kills)
        for kill in kills:
            with suppress(Exception):
                kill()
        self._thread.join(timeout=30)


def kill_session(pid: int) -> None:
    """SIGKILL to the session (process group) that `pid` leads, if it is still there."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def marked_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items in their order, the marked ones moved to the end (their jobs run meanwhile)."""
    return [i for i in items if not i.get_closest_marker(MARKER)] + [i for i in items if i.get_closest_marker(MARKER)]


def start(items: list[pytest.Item], make_folder: Callable[[str], Path]) -> Lane | None:
    """Start a lane for the marked items (in their order), or None when none is selected."""
    jobs, by_function = {}, {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and not _skipped(item):
            fn = marker.kwargs["job"]  # a keyword: a mark's lone positional callable would be marked instead
            if fn not in by_function:  # several tests marked with one function share its run
                by_function[fn] = Job(fn, make_folder(fn.__name__))
            jobs[item.nodeid] = by_function[fn]
    return Lane(jobs) if jobs else None


def _skipped(item: pytest.Item) -> bool:
    """Whether a skip mark (or a skipif mark on a plain True) skips the test: no job for it."""
    return any(True for _ in item.iter_markers("skip")) or any(
        m.args and m.args[0] is True for m in item.iter_markers("skipif"))
