"""Run a test script in a child process under Triton's CPU interpreter (TRITON_INTERPRET=1 must be
set before triton is imported, so not in the pytest process). The script prints "ok" last."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_in_triton_interpreter(script: Path, timeout: float = 600) -> None:
    """Run `script` with the repository on the path; fail with its output unless it ends with "ok"."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
