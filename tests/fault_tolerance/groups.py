"""Helpers of the fault-tolerance tests: a lighthouse in the test's process and replica groups as
real processes (the launcher's rank program, one process per rank, as torchrun would start them).

Every process is forked by one server that imported torch, torchft and the trainer once
(tests/fork_server.py): a fresh process each, killed with SIGKILL as a lost node's would be, but
started in a fraction of a second instead of seconds of imports, which the ten restarts of
test_replica_groups.py's kill test paid one after another."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from kenotron.fault_tolerance.lighthouse import LighthouseSettings, start_lighthouse
from tests.fork_server import ForkedProcess, fork_server

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layers", "1", "--model.dim", "64", "--model.n_heads", "2", "--model.n_kv_heads", "2",
        "--training.seq_len", "16", "--training.local_batch_size", "2", "--metrics.log_freq", "1",
        "--metrics.tensorboard", "false", "--lr_scheduler.warmup_steps", "2", "--training.device", "cpu"]
FT = ["--fault_tolerance.enable", "true", "--fault_tolerance.timeout_s", "20", "--fault_tolerance.quorum_timeout_s", "60"]
RANK_PRELOAD = ("torch", "torchft", "torch.distributed.checkpoint", "kenotron.fault_tolerance.attach",
                "kenotron.planner.reshard_choice", "kenotron.runtime.rank_process", "kenotron.train.trainer")
"""What the rank program and `python -m kenotron.train` import, imported once by their fork server
(with RUST_LOG=warn, which torchft reads at its import: its Rust log says a few lines a step)."""
FAST_LIGHTHOUSE = LighthouseSettings(min_replicas=1, join_timeout_ms=2000, quorum_tick_ms=20, heartbeat_timeout_ms=800)
"""A dead group is noticed within a second (the default waits five)."""


def start_process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> ForkedProcess:
    """`python *argv` in a fresh process (a session of its own) forked by the ranks' server, its
    output (stdout and stderr) into `log`, with `env` added to the environment."""
    return fork_server(RANK_PRELOAD, {"RUST_LOG": "warn"}).start(argv, log, log, env=env, new_session=True)


def run_alone(args: list[str], folder: Path) -> ForkedProcess:
    """One process without fault tolerance, `python -m kenotron.train *args`, into `folder`; its
    output goes to `folder`.txt (`output_of`)."""
    return start_process(["-m", "kenotron.train", *Group.tiny_args(), *args, "--job.dump_folder", str(folder)],
                         folder.with_suffix(".txt"))


def output_of(folder: Path) -> str:
    """What `run_alone` into `folder` printed."""
    return folder.with_suffix(".txt").read_text(errors="replace")


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
        self.procs: list[ForkedProcess] = []
        self.lives = 0

    def start(self) -> Group:
        port = free_port()
        self.lives += 1
        log = self.folder / f"replica_{self.replica_id}.life{self.lives}"
        self.procs = []
        for rank in range(self.ranks):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(self.ranks), "LOCAL_WORLD_SIZE": str(self.ranks)}
            cmd = ["-m", "kenotron.launch.rank", *TINY, *FT,
                   "--job.dump_folder", str(self.folder / f"replica_{self.replica_id}"),
                   "--fault_tolerance.replica_id", str(self.replica_id),
                   "--fault_tolerance.replica_groups", str(self.groups),
                   "--fault_tolerance.lighthouse", self.address, *self.extra]
            self.procs.append(start_process(cmd, Path(f"{log}.rank{rank}.txt"), env))
        return self

    def kill(self) -> None:
        """SIGKILL every rank of the group, as a lost node would end it."""
        for proc in self.procs:
            if proc.poll() is None:  # not one that ended already: its pid may be another's by now
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


def wait_until(condition: Callable[[], bool], timeout: float, what: str, groups: list[Group]) -> None:
    """Poll `condition` until it holds; AssertionError with the groups' last output when `timeout`
    seconds pass first, or when a process of `groups` ends with an error while waiting."""
    deadline = time.monotonic() + timeout
    while not condition():
        failed = any(p.poll() not in (None, 0) for g in groups for p in g.procs)
        if failed or time.monotonic() > deadline:
            reason = "a group failed while waiting for" if failed else f"within {timeout} s no"
            raise AssertionError(f"{reason} {what}:\n" + "\n".join(g.output()[-3000:] for g in groups))
        time.sleep(0.1)


def final_state(folder: Path, step: int, out: Path) -> dict:
    """The model and optimizer state of a run's checkpoint at `step`, as one torch.save'd dict
    (written to `out`): what the tests compare between groups."""
    dcp_to_torch_save(folder / "checkpoints" / f"step-{step:06d}", out)
    return torch.load(out, weights_only=False)
