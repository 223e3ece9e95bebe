"""Fresh Python processes in a fraction of a second, for tests that need a process of their own.

Starting a Python that imports torch costs seconds. A server process started on first use (one
per environment and preload list, kept for the session) imports the given modules once and
forks one child per request: the child runs a script, or `-c` code, as `__main__` the way
`python script` / `python -c code` would, in the server's environment and working directory
(the repository), with nothing another request did, and exits with its code. No thread exists
at the fork (the server only imports, with one OpenMP/BLAS thread). Used by
tests/triton_interpreter.py and the fresh-interpreter checks of what an import pulls in (for
those, the preloaded modules count as imported: preload only what the check does not look at).
The servers stop when the session ends (tests/conftest.py) or when the pytest process is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).parents[1]
OUTPUT_TAIL = 3000
"""Characters of a failing script's stdout and stderr quoted in the error."""
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# The server: imports the modules named in argv, then per request line (JSON: argv, stdout and
# stderr files) forks a child that runs `python *argv` as `python` would, and answers "pid N" at
# once and "exit N" when the child ended. EOF on stdin (pytest ended) ends it.
_SERVER = r"""
import importlib, json, os, runpy, sys, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
for line in sys.stdin:
    request = json.loads(line)
    argv, out, err = request["argv"], request["stdout"], request["stderr"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.stdin.close()
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                sys.path[0] = ""
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
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
    print("pid", pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkServer:
    """One server (see the module docstring); `run` returns (exit code or None, stdout, stderr)."""

    def __init__(self, preload: tuple[str, ...], extra_env: dict[str, str]) -> None:
        env = {**os.environ, **dict.fromkeys(_THREAD_ENV, "1"), **extra_env,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.folder = tempfile.mkdtemp(prefix="kenotron-fork-server-")
        self.log = os.path.join(self.folder, "server.err")
        with open(self.log, "wb") as log:  # a file, not a pipe: nobody reads it unless the server dies
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        self._pending = b""  # answer bytes read but not yet returned as lines

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

    def run(self, argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        """`python *argv` in a fresh child: its exit code (None if it ran past `timeout` seconds
        and was killed), stdout and stderr."""
        out, err = os.path.join(self.folder, "stdout"), os.path.join(self.folder, "stderr")
        self.proc.stdin.write(json.dumps({"argv": argv, "stdout": out, "stderr": err}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout + 120  # the first request also waits for the preload
        pid_line = self._line(deadline)
        if pid_line is None:
            raise TimeoutError("the fork server did not start a child in time")
        pid = int(pid_line.split()[1])
        code_line = self._line(time.monotonic() + timeout)
        if code_line is None:  # too slow: kill the script and report what it printed
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._line(time.monotonic() + 30)
            code = None
        else:
            code = int(code_line.split()[1])
        return code, Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")

    def close(self) -> None:
        self.proc.stdin.close()  # the server's loop ends at EOF
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        for name in ("stdout", "stderr", "server.err"):
            with suppress(FileNotFoundError):
                os.unlink(os.path.join(self.folder, name))
        with suppress(OSError):
            os.rmdir(self.folder)


_servers: dict[tuple, ForkServer] = {}  # the session's servers, by (preload, environment)


def fork_server(preload: tuple[str, ...], extra_env: dict[str, str] | None = None) -> ForkServer:
    """The session's server for `preload` and `extra_env` (os.environ plus these), started on first
    use or again if it died."""
    env = dict(sorted((extra_env or {}).items()))
    key = (preload, tuple(env.items()))
    server = _servers.get(key)
    if server is None or server.proc.poll() is not None:
        if server is not None:
            server.close()
        server = _servers[key] = ForkServer(preload, env)
    return server


def shutdown_servers() -> None:
    """Stop every server (session end; a later call starts new ones)."""
    while _servers:
        _servers.popitem()[1].close()


atexit.register(shutdown_servers)
