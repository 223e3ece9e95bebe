"""Helpers of the fault-tolerance tests: a lighthouse in the test's process and replica groups as
real processes (the launcher's rank program, one process per rank, as torchrun would start them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kenotron.fault_tolerance.lighthouse import LighthouseSettings, start_lighthouse

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layers", "1", "--model.dim", "64", "--model.n_heads", "2", "--model.n_kv_heads", "2",
        "--training.seq_len", "16", "--training.local_batch_size", "2", "--metrics.log_freq", "1",
        "--metrics.tensorboard", "false", "--lr_scheduler.warmup_steps", "2", "--training.device", "cpu"]
FT = ["--fault_tolerance.enable", "true", "--fault_tolerance.timeout_s", "20", "--fault_tolerance.quorum_timeout_s", "60"]
FAST_LIGHTHOUSE = LighthouseSettings(min_replicas=1, join_timeout_ms=2000, quorum_tick_ms=20, heartbeat_timeout_ms=800)
"""A dead group is noticed within a second (the default waits five)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def lighthouse(settings: LighthouseSettings = FAST_LIGHTHOUSE) -> Iterator[str]:
    """A lighthouse served from this process for the test's length; yields its address."""
    server = start_lighthouse(0, settings)
    try:
        yield server.address()
    finally:
        server.shutdown()


class Group:
    """One replica group's ranks as processes (each in a session of its own)."""

    def __init__(self, replica_id: int, groups: int, ranks: int, folder: Path, address: str, extra: list[str]) -> None:
        self.replica_id, self.groups, self.ranks = replica_id, groups, ranks
        self.folder, self.address, self.extra = folder, address, extra
        self.procs: list[subprocess.Popen] = []
        self.lives = 0

    def start(self) -> Group:
        port = free_port()
        self.lives += 1
        log = self.folder / f"replica_{self.replica_id}.life{self.lives}"
        self.procs = []
        for rank in range(self.ranks):
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(self.ranks), "LOCAL_WORLD_SIZE": str(self.ranks),
                   "RUST_LOG": "warn"}  # torchft's own log: a few lines per step at its default
            cmd = [sys.executable, "-m", "kenotron.launch.rank", *TINY, *FT,
                   "--job.dump_folder", str(self.folder / f"replica_{self.replica_id}"),
                   "--fault_tolerance.replica_id", str(self.replica_id),
                   "--fault_tolerance.replica_groups", str(self.groups),
                   "--fault_tolerance.lighthouse", self.address, *self.extra]
            out = open(f"{log}.rank{rank}.txt", "w")  # noqa: SIM115  (kept open by the process)
            self.procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        return self

    def kill(self) -> None:
        """SIGKILL every rank of the group, as a lost node would end it."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=30)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"replica group {self.replica_id} did not end within {timeout} s:\n"
                                     + self.output()) from None
        return codes

    def output(self, rank: int = 0) -> str:
        return Path(f"{self.folder / f'replica_{self.replica_id}'}.life{self.lives}.rank{rank}.txt").read_text()

    @staticmethod
    def tiny_args() -> list[str]:
        return list(TINY)

    @staticmethod
    def read_records(folder: Path) -> list[dict]:
        path = folder / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def records(self) -> list[dict]:
        return self.read_records(self.folder / f"replica_{self.replica_id}")

    def steps_done(self) -> int:
        return max((r.get("step", 0) for r in self.records() if "loss" in r), default=0)
