"""Run a test script under Triton's CPU interpreter, in a process of its own. TRITON_INTERPRET=1
must be set before triton is imported, so not in the pytest process. The script prints "ok" last.

Eight test scripts need such a process; each is forked by a server that imported torch, triton
and kenotron once (tests/fork_server.py), so each still runs in a fresh process of its own but
starts in a fraction of a second instead of seconds. Their tests run them ahead, in the background
lane (`interpreter_job`), while the in-process tests run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ahead import Lane
from tests.fork_server import OUTPUT_TAIL, fork_server

PRELOAD = ("numpy", "torch", "triton", "triton.language", "kenotron.train.trainer", "kenotron.kernels.ssd_op",
           "kenotron.train.optim")
"""What the scripts import, imported once by the server (under TRITON_INTERPRET=1, as the scripts would)."""


def run_in_triton_interpreter(script: Path, timeout: float = 600) -> str:
    """Run `script` with the repository on the path; fail with its output unless it ends with "ok".
    Returns what it printed."""
    __tracebackhide__ = True
    code, out, err = fork_server(PRELOAD, {"TRITON_INTERPRET": "1"}).run([str(Path(script).resolve())], timeout)
    assert code is not None, f"{script} ran longer than {timeout} s\n" + out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert code == 0, out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert out.strip().endswith("ok"), out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    return out


def interpreter_job(script: Path) -> Callable[[Path, Lane], str]:
    """`script` under the interpreter as a `run_ahead` job (tests/ahead.py): its seconds of
    interpreted kernels run in the background lane; the job gives what the script printed."""
    def job(folder: Path, lane: Lane) -> str:
        pytest.importorskip("triton")
        return run_in_triton_interpreter(script)
    job.__name__ = f"triton_{script.stem}"
    return job
