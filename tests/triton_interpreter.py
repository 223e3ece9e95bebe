"""Run a test script under Triton's CPU interpreter, in a process of its own. TRITON_INTERPRET=1
must be set before triton is imported, so not in the pytest process. The script prints "ok" last.

Starting a Python that imports torch, triton and kenotron costs seconds, and seven test scripts
need one. A server process started on first use (TRITON_INTERPRET=1 in its environment) does
those imports once and forks one child per script: each script still runs in a fresh process
of its own as `__main__`, with nothing another script did, and starts in a fraction of a second.
No thread exists at the fork (the server only imports, with one OpenMP/BLAS thread). The server
stops when the session ends (tests/conftest.py) or when the pytest process is gone.
"""

from __future__ import annotations

import atexit
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

# The server: imports what the scripts share, then per request line "script<TAB>stdout<TAB>stderr"
# forks a child that runs the script as `python script` would, and answers "pid N" at once and
# "exit N" when the child ended. EOF on stdin (pytest ended) ends it.
_SERVER = r"""
import os, runpy, sys, traceback
import numpy, torch, triton, triton.language
import kenotron.train.trainer, kenotron.kernels.ssd_op, kenotron.train.optim
for line in sys.stdin:
    script, out, err = line.rstrip("\n").split("\t")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.stdin.close()
            sys.argv = [script]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
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


class _Server:
    """One interpreter server (see the module docstring); `run` returns (exit code, stdout, stderr)."""

    def __init__(self) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", **dict.fromkeys(_THREAD_ENV, "1"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.folder = tempfile.mkdtemp(prefix="kenotron-triton-")
        self.log = os.path.join(self.folder, "server.err")
        with open(self.log, "wb") as log:  # a file, not a pipe: nobody reads it unless the server dies
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], cwd=ROOT, env=env, stdin=subprocess.PIPE,
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
                raise RuntimeError(f"the Triton interpreter server exited ({self.proc.wait()}):\n{tail}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode().strip()

    def run(self, script: Path, timeout: float) -> tuple[int | None, str, str]:
        out, err = os.path.join(self.folder, "stdout"), os.path.join(self.folder, "stderr")
        self.proc.stdin.write(f"{script}\t{out}\t{err}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout + 120  # the first request also waits for the imports
        pid_line = self._line(deadline)
        if pid_line is None:
            raise TimeoutError("the Triton interpreter server did not start a child in time")
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


_servers: list[_Server] = []  # the session's server, started on first use


def run_in_triton_interpreter(script: Path, timeout: float = 600) -> None:
    """Run `script` with the repository on the path; fail with its output unless it ends with "ok"."""
    __tracebackhide__ = True
    if not _servers or _servers[0].proc.poll() is not None:
        shutdown_server()
        _servers.append(_Server())
    code, out, err = _servers[0].run(Path(script).resolve(), timeout)
    assert code is not None, f"{script} ran longer than {timeout} s\n" + out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert code == 0, out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert out.strip().endswith("ok"), out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]


def shutdown_server() -> None:
    """Stop the server if one runs (session end; a later call starts a new one)."""
    while _servers:
        _servers.pop().close()


atexit.register(shutdown_server)
