"""The worker side of the multi-rank pools (tests/distributed/pool.py explains the design).

Each worker process runs `_worker_main`: it joins the gloo group through the parent's TCPStore,
then loops over calls from its pipe, running each test function with fresh per-call state and
cleaning up the process groups the function made. `_kill_group` is shared with the parent.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import os
import pickle
import queue
import random
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a collective may wait in a test (the default is 30 minutes).
PG_TIMEOUT = timedelta(seconds=60)
# Thread-count variables every rank pins to 1 (2 cores are shared by all ranks).
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

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
    # Best effort: the worker must exit (and kill its group) even if the streams are broken.
    except Exception:  # noqa: BLE001, S110
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
    """DTensor's caches must not outlive a call (kenotron/dtensor.py's forget_dtensor_caches says
    why); not imported here before a call has imported DTensor."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from kenotron.dtensor import forget_dtensor_caches

    forget_dtensor_caches()


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
    # Inductor compiles a rank's kernels in the rank, not in a pool of compile workers: that pool is
    # new Python processes importing torch, started by each rank's first compile, on the two cores
    # the ranks already share (test_compile_tp's llama3 case on a cold cache: 47 -> 36 s).
    import torch._inductor.config as inductor_config  # already imported by the fork server's preload

    inductor_config.compile_threads = 1

    inbox: queue.Queue = queue.Queue()
    threading.Thread(
        target=_reader, args=(conn, inbox, log_dir), name="parent-pipe", daemon=True
    ).start()

    def reply(msg) -> None:
        try:
            data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        # Pickling a test's return value can raise anything; it is reported as the call's error.
        except Exception:  # noqa: BLE001
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
        # Any exception that does not survive a pickle round trip is sent as traceback text only.
        except Exception:  # noqa: BLE001
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
        # The group's store where torchrun puts its own, so that what meets through torchrun's
        # store (DCP's checkpoint writer processes, kenotron/checkpoint/saver.py) meets through
        # the pool's, as in a launched job. WORLD_SIZE stays unset: no code takes this rank for
        # one that torchrun started.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Whatever stops the start-up (SystemExit and KeyboardInterrupt included) is reported to
    # the parent before the worker exits; otherwise the parent only sees a dead rank.
    except BaseException as exc:  # noqa: BLE001
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
        # pytest.fail/skip raise BaseException subclasses: every outcome of the test's function
        # must reach the parent, which then shuts the pool down.
        except BaseException as exc:  # noqa: BLE001
            error(call_id, exc)
            continue  # the parent kills the pool after a failure
        reply(("ok", call_id, result))
