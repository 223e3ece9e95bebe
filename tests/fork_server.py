"""Fresh Python processes in a fraction of a second, for tests that need a process of their own.

Starting a Python that imports torch costs seconds. A server process started on first use (one
per environment and preload list, kept for the session) imports the given modules once and
forks one child per request: the child runs a script, `-c` code or `-m` module as `__main__` the
way `python script` / `-c code` / `-m module` would, in the server's environment (plus what the
request adds) and working directory (the repository), with nothing another request did, and
exits with its code. `run` waits for the child's end; `start` returns at once with a Popen-like
handle, and several such children run side by side (the fault-tolerance tests' ranks). No
thread exists at the fork (the server only imports, with one OpenMP/BLAS thread). Used by
tests/triton_interpreter.py, tests/fault_tolerance/groups.py and the fresh-interpreter checks of
what an import pulls in (for those, the preloaded modules count as imported: preload only what
the check does not look at). The servers stop when the session ends (tests/conftest.py) or when
the pytest process is gone; a server kills the children still running when it stops.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).parents[1]
OUTPUT_TAIL = 3000
"""Characters of a failing script's stdout and stderr quoted in the error."""
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# The server: imports the modules named in argv, then per request line (JSON: argv, stdout and
# stderr files; optional env to add, a new session) forks a child that runs `python *argv` as
# `python` would, answers "pid N" at once and "exit N CODE" whenever a child ends, so that
# several children can run at once (a SIGCHLD wakes the loop through a pipe). EOF on stdin
# (pytest ended) kills the children still running and ends it.
_SERVER = r"""
import importlib, json, os, runpy, select, signal, sys, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)

def child(request):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(wake_r)
    os.close(wake_w)
    code = 1
    try:
        if request.get("session"):
            os.setsid()
        os.environ.update(request.get("env") or {})
        opened = {}
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            if path not in opened:  # stdout and stderr into one file share one offset
                opened[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened[path], fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        argv = request["argv"]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = list(argv[1:])
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(argv[0])
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

children, pending, stdin = set(), b"", sys.stdin.fileno()
while True:
    ready, _, _ = select.select([stdin, wake_r], [], [])
    if wake_r in ready:
        while True:
            try:
                if not os.read(wake_r, 512):
                    break
            except BlockingIOError:
                break
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        children.discard(pid)
        print("exit", pid, os.waitstatus_to_exitcode(status), flush=True)
    if stdin not in ready:
        continue
    chunk = os.read(stdin, 65536)
    if not chunk:
        break
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        pid = os.fork()
        if pid == 0:
            child(json.loads(line))
        children.add(pid)
        print("pid", pid, flush=True)
for pid in children:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: after torch's imports it takes seconds, once per server at session end
"""


class ForkedProcess:
    """A child started by `ForkServer.start`, with the part of `subprocess.Popen` the tests use:
    pid, poll(), wait(timeout) and returncode (negative: the signal that ended it)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server._exit_code(self.pid, time.monotonic())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = time.monotonic() + (1e9 if timeout is None else timeout)
            self.returncode = self.server._exit_code(self.pid, deadline)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
        return self.returncode


class ForkServer:
    """One server (see the module docstring): `run` runs a child to its end and returns (exit code
    or None, stdout, stderr); `start` starts one and returns at once."""

    def __init__(self, preload: tuple[str, ...], extra_env: dict[str, str]) -> None:
        env = {**os.environ, **dict.fromkeys(_THREAD_ENV, "1"), **extra_env,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.folder = tempfile.mkdtemp(prefix="kenotron-fork-server-")
        self.log = os.path.join(self.folder, "server.err")
        with open(self.log, "wb") as log:  # a file, not a pipe: nobody reads it unless the server dies
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        self._pending = b""  # answer bytes read but not yet returned as lines
        self._exits: dict[int, int] = {}  # exit codes of children, by pid, not yet asked for
        # One reader of the answers at a time: the background lane (tests/ahead.py) runs scripts
        # through the same servers as the tests, from another thread.
        self._answers = threading.Lock()
        self._runs = 0  # numbers each `run`'s output files

    def _line(self, deadline: float) -> str | None:
        """The server's next answer line, or None at the deadline; raises if the server died.
        Reads the pipe's descriptor directly: a buffered readline could hold the next line where
        select does not see it."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                tail = Path(self.log).read_text(errors="replace")[-OUTPUT_TAIL:]
                raise RuntimeError(f"the fork server exited ({self.proc.wait()}):\n{tail}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode().strip()

    def _next_pid(self, deadline: float) -> int | None:
        """The pid the server answers to the last request (exit lines read on the way are kept)."""
        while (line := self._line(deadline)) is not None:
            word, *numbers = line.split()
            if word == "pid":
                return int(numbers[0])
            self._exits[int(numbers[0])] = int(numbers[1])
        return None

    def _exit_code(self, pid: int, deadline: float) -> int | None:
        """`pid`'s exit code once the server reports it, or None at the deadline. Reads in short
        slices, so that another thread waiting for its own child or starting one gets its turn."""
        while True:
            with self._answers:
                if pid in self._exits:
                    return self._exits.pop(pid)
                line = self._line(min(deadline, time.monotonic() + 0.05))  # past the deadline: what is there
                if line is None:
                    if time.monotonic() >= deadline:
                        return None
                    continue
                word, *numbers = line.split()
                assert word == "exit", f"the fork server answered {line!r} where no child was started"
                self._exits[int(numbers[0])] = int(numbers[1])

    def start(self, argv: list[str], stdout: Path, stderr: Path, env: dict[str, str] | None = None,
              new_session: bool = False) -> ForkedProcess:
        """`python *argv` (also `-m module`) in a fresh child, its output into the files (the same
        path for both: one file), with `env` added to the server's environment; returns at once."""
        for path in (stdout, stderr):
            Path(path).write_bytes(b"")  # there as soon as this returns (the child opens it again)
        request = {"argv": argv, "stdout": str(stdout), "stderr": str(stderr), "env": env or {}, "session": new_session}
        with self._answers:  # the next "pid" answer is this request's
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = self._next_pid(time.monotonic() + 120)  # the first request also waits for the preload
        if pid is None:
            raise TimeoutError("the fork server did not start a child in time")
        return ForkedProcess(self, pid)

    def run(self, argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        """`python *argv` in a fresh child: its exit code (None if it ran past `timeout` seconds
        and was killed), stdout and stderr."""
        with self._answers:
            self._runs += 1
            out, err = Path(self.folder, f"stdout{self._runs}"), Path(self.folder, f"stderr{self._runs}")
        child = self.start(argv, out, err)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:  # too slow: kill the script and report what it printed
            with suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                child.wait(30)
            code = None
        output = out.read_text(errors="replace"), err.read_text(errors="replace")
        for path in (out, err):
            path.unlink()
        return code, *output

    def close(self) -> None:
        self.proc.stdin.close()  # the server's loop ends at EOF
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_servers: dict[tuple, ForkServer] = {}  # the session's servers, by (preload, environment)
_servers_lock = threading.Lock()  # the lane's thread and the tests' may ask for one at once


def fork_server(preload: tuple[str, ...], extra_env: dict[str, str] | None = None) -> ForkServer:
    """The session's server for `preload` and `extra_env` (os.environ plus these), started on first
    use or again if it died."""
    env = dict(sorted((extra_env or {}).items()))
    key = (preload, tuple(env.items()))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None:
            if server is not None:
                server.close()
            server = _servers[key] = ForkServer(preload, env)
        return server


TRAINER_PRELOAD = ("torch", "torch.distributed.checkpoint", "kenotron.train.trainer")
"""What a training process imports, for `start_python`'s default server."""


def start_python(argv: list[str], log: Path, env: dict[str, str] | None = None,
                 preload: tuple[str, ...] = TRAINER_PRELOAD) -> ForkedProcess:
    """`python *argv` in a fresh process of its own session, started by the server of `preload`
    in a fraction of a second; its stdout and stderr go to `log`; `env` is added to the
    environment. For the tests that kill a training process or read what it printed."""
    return fork_server(preload).start(argv, log, log, env=env, new_session=True)


def shutdown_servers() -> None:
    """Stop every server (session end; a later call starts new ones)."""
    while _servers:
        _servers.popitem()[1].close()


atexit.register(shutdown_servers)
