"""Persistent multi-rank worker pools for CPU/gloo tests.

A test hands a module-level function to :func:`run_on_ranks`; it runs on every rank of a pool of
``world_size`` worker processes that already share one gloo process group, and the per-rank return
values come back as a list in rank order. Starting ranks is the expensive part of a multi-rank test
on a small CPU machine (importing torch costs seconds per process), so one pool per world size is
started on first use and kept for the whole pytest session; a call then costs milliseconds.

How the pool is built, and why:

* Workers are forked by a ``multiprocessing`` *forkserver* whose server process has already
  imported torch and the distributed stack (``_PRELOAD``). A fork of it starts in well under a
  second, shares the imported pages copy-on-write, and never inherits the pytest process (which
  may have run OpenMP parallel regions or created threads). The server is started with
  ``OMP_NUM_THREADS=1`` in its environment and every worker also calls ``torch.set_num_threads(1)``.
* Rendezvous: the pytest process hosts a ``TCPStore`` on port 0 (the OS picks a free port) and
  passes the port to the workers; the gloo group gets ``timeout=60 s``.
* Each worker talks to the parent over its own pipe. A reader thread in the worker owns that pipe:
  when it sees EOF (the parent exited, crashed or was killed with SIGKILL) it kills the worker's
  process group at once, even while the main thread is stuck in a collective. Each worker leads its
  own process group, so anything a test spawned from a rank dies with it, and the terminal's Ctrl-C
  reaches only the pytest process, which then tears the pools down itself.
* A call: the parent sends ``(module, qualname)`` of the function plus pickled arguments; each rank
  resets per-call state (RNG seeds, default dtype, grad mode, thread count), runs the function,
  then, if every rank succeeded, does a barrier and destroys every process group other than the
  default one (those made by ``init_device_mesh`` / ``new_group`` in the test), clears DTensor's
  caches that can refer to them, and collects garbage (meshes sit in reference cycles), so hundreds
  of tests do not pile up gloo connections and threads. The collection is cheap because each worker
  ``gc.freeze()``-s the heap it inherited; that also keeps those pages shared with the fork server
  (about 20 MB private memory per worker instead of about 85 MB).
* Failures: an exception on a rank comes back with its traceback. The other ranks get
  ``FAILURE_GRACE`` seconds to finish or fail too (they are often blocked in a collective waiting
  for the failed rank); ranks still running after that, or after the call's timeout, get their
  Python stacks dumped (``faulthandler`` on SIGUSR1) into the error. After any failure the pool is
  killed, because a failed collective can leave the group unusable; the next call starts a new one.
* Output: each rank's stdout/stderr go to files; after every call the new lines are copied to the
  pytest process's ``sys.stdout`` / ``sys.stderr`` prefixed with ``[rank r]``, so pytest shows them
  with the test (``-s`` shows them live, per call). Error messages carry the tail of a failing
  rank's stderr.

Pools are shut down by :func:`shutdown_pools`, which ``tests/conftest.py`` calls at session end and
an ``atexit`` hook calls as a fallback.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import gc
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT",
    "RankError",
    "RankTimeout",
    "WorkerPool",
    "get_pool",
    "multirank",
    "run_on_ranks",
    "shutdown_pools",
]

DEFAULT_TIMEOUT = 120.0
"""Seconds a call may run on the ranks before it fails (``timeout=`` overrides it)."""
START_TIMEOUT = 180.0
"""Seconds a pool may take to start (the first start also imports torch in the fork server)."""
FAILURE_GRACE = 1.0
"""Seconds the other ranks get to finish (or fail) after one rank failed, before the kill."""
PG_TIMEOUT = timedelta(seconds=60)
"""Timeout of the gloo process group (the default is 30 minutes)."""
OUTPUT_TAIL = 4000
"""Characters of a failing rank's stderr quoted in the error."""

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
]
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class RankError(RuntimeError):
    """One or more ranks failed (raised, died, or hung) during a call.

    ``failures`` maps each failing rank to a text block (its traceback, or the stack it hung in).
    When a rank raised a picklable exception, the first such exception is chained as
    ``__cause__``.
    """

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures


class RankTimeout(RankError):
    """A call did not finish on every rank within its timeout (and no rank raised)."""


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
    os.environ.update({k: "1" for k in _THREAD_ENV})
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
        self._logs: list[tuple[Any, Any]] = []
        self._offsets: list[tuple[int, int]] = [(0, 0)] * world_size
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
        self._forward_output()

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
        for out, err in self._logs:
            out.close()
            err.close()
        self._logs = []
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
        self._mark_output()
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
        self._forward_output()
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
                except Exception:  # unpicklable reply (e.g. a class the parent cannot import)
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
                        except Exception:
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
                try:
                    os.kill(self._procs[r].pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)
        texts: dict[int, str] = {}
        tails = self._forward_output()
        blocks = []
        for r in sorted(failures):
            tb, _ = failures[r]
            texts[r] = tb
            block = f"--- rank {r} ---\n{tb.rstrip()}"
            err_tail = tails[r][1][-OUTPUT_TAIL:]
            if err_tail.strip():
                block += f"\n--- rank {r} stderr (tail) ---\n{err_tail.rstrip()}"
            blocks.append(block)
        for r in sorted(pending):
            err_tail = tails[r][1][-OUTPUT_TAIL:]
            texts[r] = err_tail
            state = "still running" if failures else "did not finish"
            blocks.append(
                f"--- rank {r}: {state}; stderr tail with its stack ---\n{err_tail.rstrip()}"
            )
        self.close()
        if timeout:
            head = f"{what}: ranks {sorted(pending)} did not finish"
            cls = RankTimeout
        else:
            head = f"{what}: rank(s) {sorted(failures)} failed"
            if pending:
                head += f"; ranks {sorted(pending)} were still running {FAILURE_GRACE:g} s later"
            cls = RankError
        message = head + " (the pool was shut down and restarts on next use)\n" + "\n".join(blocks)
        error = cls(message, texts)
        cause = next((failures[r][1] for r in sorted(failures) if failures[r][1] is not None), None)
        raise error from cause

    # -- output --------------------------------------------------------------------------------

    def _open_logs(self) -> None:
        if not self._logs:
            for r in range(self.world_size):
                base = os.path.join(self._log_dir, f"rank{r}")
                self._logs.append((open(base + ".out", "rb"), open(base + ".err", "rb")))

    def _mark_output(self) -> None:
        self._open_logs()
        self._offsets = [
            (os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size)
            for out, err in self._logs
        ]

    def _read_output(self) -> list[tuple[str, str]]:
        """New output of each rank since the last mark, as (stdout, stderr)."""
        try:
            self._open_logs()
        except OSError:
            return [("", "")] * self.world_size
        texts = []
        for (out, err), (o_off, e_off) in zip(self._logs, self._offsets):
            pair = []
            for f, off in ((out, o_off), (err, e_off)):
                f.seek(off)
                pair.append(f.read().decode("utf-8", errors="replace"))
            texts.append(tuple(pair))
        self._mark_output()
        return texts

    def _forward_output(self) -> list[tuple[str, str]]:
        outputs = self._read_output()
        for rank, (out, err) in enumerate(outputs):
            for text, stream in ((out, sys.stdout), (err, sys.stderr)):
                if text:
                    prefix = f"[rank {rank}] "
                    stream.write("".join(prefix + line for line in text.splitlines(True)))
                    if not text.endswith("\n"):
                        stream.write("\n")
                    stream.flush()
        return outputs


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
            except Exception:
                pass


atexit.register(shutdown_pools)


def _kill_group(pid: int | None) -> None:
    """SIGKILL a worker and its process group (it leads its own group; see _worker_main)."""
    if pid is None:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:  # it died, or has not reached os.setpgrp() yet
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------------

_fn_cache: dict[tuple[str, str, str | None], Callable] = {}


def _die(code: int = 1) -> None:
    """Exit now, with everything this worker started (it leads its own process group)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(code)


def _reader(conn, inbox: queue.Queue, log_dir: str) -> None:
    """Owns the pipe to the parent: EOF means the parent is gone, so the worker must go too."""
    try:
        while True:
            inbox.put(conn.recv_bytes())
    except (EOFError, OSError):
        pass
    shutil.rmtree(log_dir, ignore_errors=True)  # the parent may not have lived to do it
    _die()


def _resolve(ref: tuple[str, str, str | None]) -> Callable:
    fn = _fn_cache.get(ref)
    if fn is None:
        module_name, qualname, path = ref
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            # e.g. pytest's importlib import mode, where the module name is not importable.
            if path is None:
                raise
            module = sys.modules.get(module_name)
            if module is None or getattr(module, "__file__", None) != path:
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
        fn = module
        for part in qualname.split("."):
            fn = getattr(fn, part)
        fn = getattr(fn, "__multirank_fn__", fn)
        _fn_cache[ref] = fn
    return fn


def _reset_state() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(0)
    if torch.get_default_dtype() != torch.float32:
        torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _clean_after_call() -> None:
    """Free what a call created that would otherwise pile up over hundreds of tests."""
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        raise RuntimeError("the function destroyed the pool's default process group; it must not")
    extra = [pg for pg in list(c10d._world.pg_map) if pg is not c10d.GroupMember.WORLD]
    if extra:
        dist.barrier()  # every rank is done with the groups before any of them closes its sockets
        for pg in extra:
            dist.destroy_process_group(pg)
    _clear_dtensor_caches()
    if extra:
        # Meshes sit in reference cycles that keep their gloo contexts (~5 fds and ~3 threads per
        # group) alive until a full collection; cheap since gc.freeze() at worker start.
        gc.collect()


def _clear_dtensor_caches() -> None:
    """DeviceMesh equality ignores process groups, so DTensor's caches (sharding propagation in
    Python and C++, redistribute planners, the RNG tracker) would hand a later call an old, equal
    mesh whose groups were destroyed. They must not outlive a call. All private, hence guarded."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    import torch.distributed.tensor._random as dtensor_random
    import torch.distributed.tensor._redistribute as redistribute
    import torch.distributed.tensor.debug as dtensor_debug

    dtensor_random._rng_tracker = None
    for clear in (
        getattr(dtensor_debug, "_clear_sharding_prop_cache", None),
        getattr(redistribute, "clear_redistribute_planner_cache", None),
        getattr(getattr(redistribute, "_gen_transform_infos", None), "cache_clear", None),
    ):
        if clear is not None:
            clear()


def _worker_main(rank: int, world_size: int, port: int, conn, log_dir: str) -> None:
    global _in_worker
    _in_worker = True
    os.setpgrp()  # own process group: Ctrl-C goes to pytest only; _die() takes our children along
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    base = os.path.join(log_dir, f"rank{rank}")
    for fd, suffix in ((1, ".out"), (2, ".err")):
        log = os.open(base + suffix, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, fd)
        os.close(log)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    for k in _THREAD_ENV:
        os.environ[k] = "1"
    torch.set_num_threads(1)

    inbox: queue.Queue = queue.Queue()
    threading.Thread(
        target=_reader, args=(conn, inbox, log_dir), name="parent-pipe", daemon=True
    ).start()

    def reply(msg) -> None:
        try:
            data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(
                (
                    "err",
                    msg[1],
                    "the return value could not be pickled:\n" + traceback.format_exc(),
                    None,
                )
            )
        conn.send_bytes(data)

    def error(call_id, exc: BaseException) -> None:
        tb_obj = exc.__traceback__
        if (
            tb_obj is not None
            and tb_obj.tb_next is not None
            and tb_obj.tb_frame.f_code is _worker_main.__code__
        ):
            tb_obj = tb_obj.tb_next  # start at the test's function, not at this loop
        tb = "".join(traceback.format_exception(type(exc), exc, tb_obj))
        try:
            exc_bytes = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
            pickle.loads(exc_bytes)
        except Exception:
            exc_bytes = None
        sys.stdout.flush()
        sys.stderr.flush()
        reply(("err", call_id, tb, exc_bytes))

    try:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=PG_TIMEOUT)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=PG_TIMEOUT
        )
        dist.barrier()
    except BaseException as exc:
        error(None, exc)
        _die()
    gc.freeze()  # torch's ~300k objects: never scanned again by the collector, nor dirtied (COW)
    reply(("ok", None, os.getpid()))

    while True:
        data = inbox.get()
        call_id = None
        try:
            _, call_id, ref, args, kwargs = pickle.loads(data)
            fn = _resolve(ref)
            _reset_state()
            result = fn(*args, **kwargs)
            sys.stdout.flush()
            sys.stderr.flush()
            _clean_after_call()
        except BaseException as exc:
            error(call_id, exc)
            continue  # the parent kills the pool after a failure
        reply(("ok", call_id, result))
