"""Helpers of the fault-injection tests: training jobs as real processes, and their ranks' pids."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--metrics.log_freq", "1", "--metrics.tensorboard", "false", "--lr_scheduler.warmup_steps", "2"]


def start_job(nproc: int, dump_folder: Path, overrides: list[str]) -> subprocess.Popen:
    """torchrun (standalone, `nproc` ranks on CPU) running kenotron.train, in a session of its own."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--local-ranks-filter", ",".join(map(str, range(nproc))), "-m", "kenotron.train",
           *TINY, "--job.dump_folder", str(dump_folder), *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for_line(job: subprocess.Popen, pattern: str, timeout: float, seen: list[str]) -> str:
    """Read the job's output until a line contains `pattern` (returned); every line read is appended to `seen`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = job.stdout.readline()
        if not line:
            raise AssertionError(f"the job ended before printing {pattern!r}:\n" + "".join(seen[-60:]))
        seen.append(line)
        if pattern in line:
            return line
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n" + "".join(seen[-60:]))


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the launcher's worker processes (from their environment; Linux)."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            env = dict(v.split("=", 1) for v in (entry / "environ").read_bytes().decode().split("\0") if "=" in v)
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in env:
            pids[int(env["RANK"])] = int(entry.name)
    return pids


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_job(job: subprocess.Popen) -> str:
    """SIGKILL the job and every process it started (torchrun gives each rank a session of its
    own; stopped processes included); returns the rest of its output."""
    for pid in [job.pid, *descendants(job.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    rest, _ = job.communicate(timeout=60)
    return rest or ""
