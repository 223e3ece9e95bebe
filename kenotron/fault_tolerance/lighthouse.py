"""The lighthouse (torchft's quorum server) and what the launcher adds for one replica group.

`kenotron train` with fault_tolerance.enable runs one replica group: torchrun over the group's
ranks, restarted by torchrun when one of them dies (fault_tolerance.max_restarts), each group in
its own run folder `<job.dump_folder>/replica_<id>`. With fault_tolerance.lighthouse = "start"
the launcher also serves the lighthouse from its own process (one host; the other groups point
at it); otherwise the lighthouse is torchft's `torchft_lighthouse` command, started once per run.

No torch at import: the launcher imports this before it decides to import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kenotron.config import JobConfig
from kenotron.fault_tolerance.checks import LIGHTHOUSE_ENV


@dataclass
class LighthouseSettings:
    """How a lighthouse decides quorums (torchft's LighthouseServer arguments)."""

    min_replicas: int = 1
    """Groups needed for a quorum."""
    join_timeout_ms: int = 60_000
    """How long a quorum waits for a heartbeating group that has not asked to join yet (torchft's
    default; under DiLoCo it must exceed the time between syncs)."""
    quorum_tick_ms: int = 100
    """How often the lighthouse looks for a quorum."""
    heartbeat_timeout_ms: int = 2_000
    """A group silent this long is dead: the next quorum goes on without it. Each manager beats
    every 100 ms from a thread of its own (torchft's default interval), so 2 s is 20 beats
    missed. A survivor whose all-reduce failed at once (gloo: a closed connection) waits for its
    next quorum until the dead group's beats are this old: on CPU (the bench through the
    launcher) its quorum came 5.0 s after the kill with torchft's default of 5 s, 2.0 s with 2 s.
    On NCCL the all-reduce's own timeout (fault_tolerance.timeout_s, 10 s) comes first."""


def start_lighthouse(port: int = 0, settings: LighthouseSettings | None = None) -> Any:
    """A lighthouse served from this process (torchft's LighthouseServer, on all interfaces at
    `port`, 0: a free one): `.address()` is its http://host:port, `.shutdown()` stops it."""
    from torchft._torchft import LighthouseServer

    s = settings or LighthouseSettings()
    return LighthouseServer(bind=f"[::]:{port}", min_replicas=s.min_replicas, join_timeout_ms=s.join_timeout_ms,
                            quorum_tick_ms=s.quorum_tick_ms, heartbeat_timeout_ms=s.heartbeat_timeout_ms)


def replica_dump_folder(cfg: JobConfig) -> str:
    """The group's own run folder (each group locks, logs and checkpoints its own)."""
    return os.path.join(cfg.job.dump_folder, f"replica_{cfg.fault_tolerance.replica_id}")


@dataclass
class ReplicaGroupLaunch:
    """What the launcher changes to start one replica group (`prepare_replica_group`)."""

    torchrun_args: list[str]
    """Arguments put before torchrun's others: its restarts of the group."""
    lighthouse: Any = None
    """The lighthouse this launcher serves (kept alive while the group runs), or None."""

    def close(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None


def replica_group_argv(cfg: JobConfig, train_argv: list[str]) -> list[str]:
    """The ranks' arguments for a fault-tolerant group: the user's, plus the group's run folder.
    Also quiets torchft's Rust log for the launcher and its ranks (it logs every quorum and
    commit, a few lines per step, at its default level; read once, when torchft is first
    imported, which the launcher's checks do next)."""
    os.environ.setdefault("RUST_LOG", "warn")
    return [*train_argv, "--job.dump_folder", replica_dump_folder(cfg)]


def prepare_replica_group(cfg: JobConfig) -> ReplicaGroupLaunch:
    """The launcher's part for a fault-tolerant group, once its config passed every check: the
    lighthouse started or pointed at ($TORCHFT_LIGHTHOUSE for the ranks), torchrun's restarts."""
    ft = cfg.fault_tolerance
    lighthouse = None
    if ft.lighthouse == "start":
        lighthouse = start_lighthouse(ft.lighthouse_port, LighthouseSettings(min_replicas=ft.min_replicas))
        os.environ[LIGHTHOUSE_ENV] = lighthouse.address()
        print(f"kenotron: lighthouse at {lighthouse.address()}: start the other groups with "
              f"--fault_tolerance.lighthouse {lighthouse.address()}", flush=True)
    elif ft.lighthouse:
        os.environ[LIGHTHOUSE_ENV] = ft.lighthouse
    return ReplicaGroupLaunch(["--max-restarts", str(ft.max_restarts)], lighthouse)
