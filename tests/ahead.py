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

Under pytest-xdist (`-n 2`, README's command) every worker collects the same items, so every
worker knows every job; each runs its share in its own lane (`Share`: job i on worker
i % workers) and writes each outcome, pickled, into a folder the workers share, where a test on
another worker reads it (`Lane.result` waits for the file). A worker ends its session only once
its own jobs ended: another worker's test may still wait for one.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

LONGEST_SHOWN = 5
"""How many of the longest jobs the session's summary line names."""
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


@dataclass(frozen=True)
class Share:
    """This worker's part of the jobs under pytest-xdist: job i (in collection order) runs on
    worker i % `workers`; the others' outcomes are read from `folder`."""

    folder: Path
    """A folder every worker of the session sees: the outcome of job i is `folder/job-{i}.pickle`."""
    worker: int
    """This worker's number (gw0 is 0)."""
    workers: int
    """How many workers the session has."""

    def owner_file(self, worker: int) -> Path:
        """Where worker `worker` writes its pid: a test waiting for its job checks it is alive."""
        return self.folder / f"worker-{worker}.pid"


class Lane:
    """The background thread that runs the jobs in order; `stop` ends it and kills its processes."""

    def __init__(self, jobs: dict[str, Job], share: Share | None = None):
        self.jobs = jobs  # by test; tests marked with the same function share its one job
        self.share = share
        self._position = {job: i for i, job in enumerate(dict.fromkeys(jobs.values()))}
        if share is not None:
            share.folder.mkdir(parents=True, exist_ok=True)
            share.owner_file(share.worker).write_text(str(os.getpid()))
        self._stopped = False
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()  # started by `start`, not yet waited for
        self._kills: list[Callable[[], object]] = []  # what `stop` calls besides (see `killed_at_stop`)
        self.waited = 0.0  # seconds the tests spent waiting for their jobs
        self._thread = threading.Thread(target=self._work, name="kenotron-tests-run-ahead", daemon=True)
        self._thread.start()

    def _owner(self, job: Job) -> int:
        """The worker that runs `job` (0 without xdist)."""
        return 0 if self.share is None else self._position[job] % self.share.workers

    def _mine(self, job: Job) -> bool:
        return self.share is None or self._owner(job) == self.share.worker

    def _work(self) -> None:
        for job in filter(self._mine, dict.fromkeys(self.jobs.values())):
            if self._stopped:
                job.error = RuntimeError("the session ended before this job ran")
            else:
                started = time.monotonic()
                try:
                    job.value = job.fn(job.folder, self)
                except BaseException as error:  # noqa: BLE001  (the test re-raises it)
                    job.error = error
                job.seconds = time.monotonic() - started
            if self.share is not None:
                self._publish(job)
            job.done.set()

    def _outcome_file(self, job: Job) -> Path:
        assert self.share is not None
        return self.share.folder / f"job-{self._position[job]}.pickle"

    def _publish(self, job: Job) -> None:
        """The job's outcome pickled for the other workers (written whole, then renamed)."""
        error = job.error
        try:
            data = pickle.dumps((job.value, error, job.seconds))
        except Exception:  # noqa: BLE001  (an outcome that does not pickle still reaches the test, as text)
            text = "".join(traceback.format_exception(error)) if error is not None else repr(job.value)
            data = pickle.dumps((None, RuntimeError(f"{job.fn.__name__}'s outcome does not pickle: {text}"),
                                 job.seconds))
        path = self._outcome_file(job)
        path.with_suffix(".partial").write_bytes(data)
        path.with_suffix(".partial").replace(path)

    def _read_published(self, job: Job) -> None:
        """Wait for another worker's outcome of `job` and take it as ours."""
        assert self.share is not None
        path, owner = self._outcome_file(job), self._owner(job)
        while not path.exists():
            pid = self.share.owner_file(owner).read_text() if self.share.owner_file(owner).exists() else ""
            if pid and not _alive(int(pid)) and not path.exists():
                raise RuntimeError(f"xdist worker gw{owner} (pid {pid}), which runs {job.fn.__name__}, "
                                   "ended before its job did: see that worker's errors")
            time.sleep(0.1)
        job.value, job.error, job.seconds = pickle.loads(path.read_bytes())
        job.done.set()

    def result(self, nodeid: str) -> Any:
        """What the job of test `nodeid` returned, once it ended; raises what it raised."""
        job = self.jobs[nodeid]
        started = time.monotonic()
        if self._mine(job):
            job.done.wait()
        elif not job.done.is_set():
            self._read_published(job)
        self.waited += time.monotonic() - started
        if job.error is not None:
            raise job.error
        return job.value

    def summary(self) -> str:
        """One line for the end of the session: what ran ahead, and what the tests waited for it;
        then the longest jobs, the first to shorten when the lane grows."""
        jobs = [job for job in dict.fromkeys(self.jobs.values()) if self._mine(job)]
        ran = sum(job.seconds for job in jobs)
        where = "" if self.share is None else f" on xdist worker gw{self.share.worker}"
        longest = sorted(jobs, key=lambda job: -job.seconds)[:LONGEST_SHOWN]
        return (f"run ahead (tests/ahead.py){where}: {len(jobs)} job{'s' * (len(jobs) != 1)}, {ran:.0f} s in the "
                f"background; their tests waited {self.waited:.0f} s for them; longest: "
                + ", ".join(f"{job.folder.name} {job.seconds:.0f} s" for job in longest))

    def finish(self) -> None:
        """Wait until this worker's own jobs ended (another worker's test may wait for one)."""
        self._thread.join()

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marked_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items in their order, the marked ones moved to the end (their jobs run meanwhile)."""
    return [i for i in items if not i.get_closest_marker(MARKER)] + [i for i in items if i.get_closest_marker(MARKER)]


def start(items: list[pytest.Item], make_folder: Callable[[str], Path], share: Share | None = None) -> Lane | None:
    """Start a lane for the marked items (in their order), or None when none is selected; under
    xdist, `share` says which of the jobs this worker runs."""
    jobs, by_function = {}, {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and not _skipped(item):
            fn = marker.kwargs["job"]  # a keyword: a mark's lone positional callable would be marked instead
            if fn not in by_function:  # several tests marked with one function share its run
                by_function[fn] = Job(fn, make_folder(fn.__name__))
            jobs[item.nodeid] = by_function[fn]
    return Lane(jobs, share) if jobs else None


def _skipped(item: pytest.Item) -> bool:
    """Whether a skip mark (or a skipif mark on a plain True) skips the test: no job for it."""
    return any(True for _ in item.iter_markers("skip")) or any(
        m.args and m.args[0] is True for m in item.iter_markers("skipif"))
