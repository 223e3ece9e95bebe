"""Run a test script under Triton's CPU interpreter, in a process of its own. TRITON_INTERPRET=1
must be set before triton is imported, so not in the pytest process. The script prints "ok" last.

Seven test scripts need such a process; each is forked by a server that imported torch, triton
and kenotron once (tests/fork_server.py), so each still runs in a fresh process of its own but
starts in a fraction of a second instead of seconds.
"""

from __future__ import annotations

from pathlib import Path

from tests.fork_server import OUTPUT_TAIL, fork_server

PRELOAD = ("numpy", "torch", "triton", "triton.language", "kenotron.train.trainer", "kenotron.kernels.ssd_op",
           "kenotron.train.optim")
"""What the scripts import, imported once by the server (under TRITON_INTERPRET=1, as the scripts would)."""


def run_in_triton_interpreter(script: Path, timeout: float = 600) -> None:
    """Run `script` with the repository on the path; fail with its output unless it ends with "ok"."""
    __tracebackhide__ = True
    code, out, err = fork_server(PRELOAD, {"TRITON_INTERPRET": "1"}).run([str(Path(script).resolve())], timeout)
    assert code is not None, f"{script} ran longer than {timeout} s\n" + out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert code == 0, out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
    assert out.strip().endswith("ok"), out[-OUTPUT_TAIL:] + err[-OUTPUT_TAIL:]
