"""Persistent multi-rank worker pools for CPU/gloo tests.

A test hands a module-level function to :func:`run_on_ranks`; it runs on every rank of a pool of
``world_size`` worker processes that already share one gloo process group, and the per-rank return
values come back as a list in rank order. Starting ranks is the expensive part of a multi-rank test
on a small CPU machine (importing torch costs seconds per process), so one pool per world size is
started on first use and kept for the whole pytest session; a call then costs milliseconds.

How the pool is built, and why (forkserver, rendezvous, per-call reset, failures, output):
see "How the worker pools work" in docs/testing.md. The ranks' side is worker.py; what they print
is read by rank_output.py; a failed call's error is rank_errors.py's (RankError and RankTimeout,
importable from here as before).

Pools are shut down by :func:`shutdown_pools`, which ``tests/conftest.py`` calls at session end and
an ``atexit`` hook calls as a fallback.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager, suppress
from typing import Any

import torch.distributed as dist

from tests.distributed.rank_errors import FAILURE_GRACE, RankError, RankTimeout, rank_failure
from tests.distributed.rank_output import RankOutput
from tests.distributed.worker import _THREAD_ENV, PG_TIMEOUT, _kill_group, _worker_main

__all__ = [
    "DEFAULT_TIMEOUT",
    "RankError",
    "RankTimeout",
    "WorkerPool",
    "close_pool",
    "get_pool",
    "multirank",
    "run_on_ranks",
    "shutdown_pools",
]

DEFAULT_TIMEOUT = 120.0
"""Seconds a call may run on the ranks before it fails (``timeout=`` overrides it)."""
START_TIMEOUT = 180.0
"""Seconds a pool may take to start (the first start also imports torch in the fork server)."""

# Imported once by the fork server; every worker gets them for free.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "torch.distributed.checkpoint",
    "numpy",
    "pytest",
    "tests.distributed.preload",  # kenotron's trainer modules and the built-in corpus (preload.py)
]


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------

_pools: dict[int, WorkerPool] = {}
_lock = threading.RLock()
_in_worker = False
_started_workers = False  # whether this process started pool workers (and so the fork server)


@contextmanager
def _worker_start_env():
    """While workers start: one OpenMP thread for the fork server (its environment is ours), and
    no re-import of the parent's ``__main__`` in each worker (multiprocessing would run a script's
    unguarded top level again, and under pytest it would import pytest's entry script)."""
    import multiprocessing.spawn as mp_spawn

    saved = {k: os.environ.get(k) for k in _THREAD_ENV}
    os.environ.update(dict.fromkeys(_THREAD_ENV, "1"))
    get_data = mp_spawn.get_preparation_data

    def get_data_without_main(name):
        data = get_data(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = get_data_without_main
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = get_data
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _context():
    global _started_workers
    _started_workers = True
    ctx = multiprocessing.get_context("forkserver")
    # Only takes effect if the server is not running yet (it is per pytest process).
    ctx.set_forkserver_preload(_PRELOAD + [__name__])
    return ctx


def _fn_ref(fn: Callable) -> tuple[str, str, str | None]:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"run_on_ranks needs a module-level function (the ranks import it), got {fn!r}"
        )
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    return module, qualname, path


class WorkerPool:
    """``world_size`` worker processes in one gloo process group. Use :func:`get_pool`."""

    def __init__(self, world_size: int):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.started_at = time.monotonic()
        self.ready_after: float | None = None  # seconds from start to all ranks ready
        self.calls = 0
        self._call_id = 0
        self._closed = False
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._log_dir = tempfile.mkdtemp(prefix=f"kenotron-pool{world_size}-")
        self._output = RankOutput(self._log_dir, world_size)
        self._store = dist.TCPStore(
            "127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=PG_TIMEOUT
        )
        try:
            ctx = _context()
            with _worker_start_env():
                for rank in range(world_size):
                    parent_conn, child_conn = ctx.Pipe(duplex=True)
                    proc = ctx.Process(
                        target=_worker_main,
                        args=(rank, world_size, self._store.port, child_conn, self._log_dir),
                        name=f"kenotron-rank{rank}-of-{world_size}",
                    )
                    proc.start()
                    child_conn.close()
                    self._procs.append(proc)
                    self._conns.append(parent_conn)
        except BaseException:
            self.close()
            raise
        self._ready = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return not self._closed

    # -- lifecycle -----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        __tracebackhide__ = True
        if self._ready:
            return
        try:
            _, failures, pending = self._collect(None, START_TIMEOUT)
        except BaseException:
            self.close()
            raise
        if failures or pending:
            self._fail(
                f"the {self.world_size}-rank pool failed to start", failures, pending, timeout=False
            )
        self._ready = True
        self.ready_after = time.monotonic() - self.started_at
        self._output.forward()

    def close(self) -> None:
        """Stop the workers (SIGKILL: they may be stuck in a collective) and free everything."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            _kill_group(proc.pid)
        for conn in self._conns:
            conn.close()
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.exitcode is None:  # pragma: no cover - should not happen after SIGKILL
                proc.kill()
                proc.join(timeout=5)
        self._output.close()
        shutil.rmtree(self._log_dir, ignore_errors=True)
        self._store = None
        with _lock:
            if _pools.get(self.world_size) is self:
                del _pools[self.world_size]

    # -- calls ---------------------------------------------------------------------------------

    def run(
        self, fn: Callable, args: tuple, kwargs: dict, timeout: float = DEFAULT_TIMEOUT
    ) -> list:
        __tracebackhide__ = True  # pytest: show the test and the ranks' tracebacks, not this
        if self._closed:
            raise RuntimeError("this pool was closed; use get_pool() for a fresh one")
        ref = _fn_ref(fn)
        payload = pickle.dumps(
            ("call", self._call_id + 1, ref, args, kwargs), pickle.HIGHEST_PROTOCOL
        )
        self._wait_ready()
        self._call_id += 1
        self.calls += 1
        self._output.mark()
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
            replies, failures, pending = self._collect(self._call_id, timeout)
        except BaseException:  # KeyboardInterrupt, broken pipe: the ranks are mid-call
            self.close()
            raise
        if failures or pending:
            what = f"{ref[0]}.{ref[1]} on {self.world_size} ranks"
            self._fail(what, failures, pending, timeout=not failures)
        self._output.forward()
        return [replies[r] for r in range(self.world_size)]

    def _collect(self, call_id, timeout):
        """Wait for one reply per rank. Returns (replies, failures, still-pending ranks)."""
        start = time.monotonic()
        deadline = start + timeout
        replies: dict[int, Any] = {}
        failures: dict[int, tuple[str, BaseException | None]] = {}
        pending = set(range(self.world_size))
        conn_rank = {self._conns[r]: r for r in pending}
        sentinel_rank = {self._procs[r].sentinel: r for r in pending}
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            waitables = [self._conns[r] for r in pending] + [
                self._procs[r].sentinel for r in pending
            ]
            for obj in multiprocessing.connection.wait(waitables, deadline - now):
                rank = conn_rank.get(obj) if not isinstance(obj, int) else sentinel_rank.get(obj)
                if rank not in pending:
                    continue
                conn = self._conns[rank]
                try:
                    msg = pickle.loads(conn.recv_bytes()) if conn.poll() else None
                except (EOFError, OSError):  # the worker is gone (or going)
                    msg = None
                # Unpickling can raise anything (e.g. a class the parent cannot import); it becomes
                # this rank's reported failure instead of crashing the pool.
                except Exception:  # noqa: BLE001
                    msg = (
                        "err",
                        call_id,
                        "reply could not be unpickled:\n" + traceback.format_exc(),
                        None,
                    )
                if msg is None:
                    self._procs[rank].join(timeout=1)
                    code = self._procs[rank].exitcode
                    failures[rank] = (f"rank {rank} died (exit code {code})", None)
                elif msg[0] == "ok" and msg[1] == call_id:
                    replies[rank] = msg[2]
                elif msg[0] == "err" and msg[1] == call_id:
                    exc = None
                    if msg[3] is not None:
                        try:
                            exc = pickle.loads(msg[3])
                        # Any unpickling error: the traceback text in msg[2] is still reported.
                        except Exception:  # noqa: BLE001
                            exc = None
                    failures[rank] = (msg[2], exc)
                else:
                    continue  # a stale message; cannot happen as pools die after a failure
                pending.discard(rank)
                if failures:
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        return replies, failures, pending

    def _fail(self, what: str, failures, pending, timeout: bool):
        """Dump the stacks of ranks still running, kill the pool, raise a RankError."""
        __tracebackhide__ = True
        if pending:
            for r in pending:
                with suppress(ProcessLookupError):
                    os.kill(self._procs[r].pid, signal.SIGUSR1)
            time.sleep(0.3)
        tails = self._output.forward()
        self.close()
        error, cause = rank_failure(what, failures, pending, tails, timeout=timeout)
        raise error from cause


def get_pool(world_size: int) -> WorkerPool:
    """The session's pool for ``world_size`` ranks, started if there is none (or it failed)."""
    if _in_worker:
        raise RuntimeError("run_on_ranks cannot be called from inside a rank")
    with _lock:
        pool = _pools.get(world_size)
        if pool is None or not pool.alive:
            pool = WorkerPool(world_size)
            _pools[world_size] = pool
        return pool


def close_pool(world_size: int) -> None:
    """Stop the ``world_size`` pool if one runs (a large pool used by one test frees its memory)."""
    with _lock:
        pool = _pools.get(world_size)
    if pool is not None:
        pool.close()


def run_on_ranks(
    world_size: int, fn: Callable, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs
) -> list:
    """Run ``fn(*args, **kwargs)`` on every rank of the ``world_size`` pool; return the results.

    ``fn`` must be a module-level function (it is imported by module and qualified name on the
    ranks); arguments and return values are pickled. The default gloo process group is initialized
    when ``fn`` starts, the RNGs are seeded with 0, and process groups ``fn`` creates are destroyed
    after it returns. An exception, a crash or a hang (longer than ``timeout`` seconds) on any rank
    raises :class:`RankError` / :class:`RankTimeout` here and restarts the pool on next use.
    """
    __tracebackhide__ = True
    return get_pool(world_size).run(fn, args, kwargs, timeout=timeout)


def multirank(world_size: int, *, timeout: float = DEFAULT_TIMEOUT):
    """Decorate a module-level test so that its body runs on every rank of a ``world_size`` pool.

    Fixture and parametrize arguments are passed through (they must be picklable); return values
    are discarded. For results, or for a check that needs all ranks' values, use
    :func:`run_on_ranks` from an ordinary test instead.
    """

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def test(*args, **kwargs) -> None:
            __tracebackhide__ = True
            get_pool(world_size).run(test, args, kwargs, timeout=timeout)

        test.__multirank_fn__ = fn  # what the ranks run (the module attribute is this wrapper)
        return test

    return decorate


def shutdown_pools() -> None:
    """Stop every pool and the fork server (session end; also registered with atexit).

    The fork server would exit by itself once this process is gone, but tearing down an
    interpreter that imported torch takes it a few seconds; it is killed instead, so that ``ps``
    right after a run shows nothing left. A later call starts everything again.
    """
    with _lock:
        pools = list(_pools.values())
        for pool in pools:
            pool.close()
        server = multiprocessing.forkserver._forkserver
        pid = getattr(server, "_forkserver_pid", None)
        if _started_workers and pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
                server._stop()  # private: closes its pipe, reaps it, forgets it
            # Session-end / atexit cleanup: the server may be gone already and _stop() is private
            # API, so whatever it raises must not turn a finished run into a crash.
            except Exception:  # noqa: BLE001, S110
                pass


atexit.register(shutdown_pools)
