"""The `[fault_tolerance]` section's checks: config only, no torch, run by the launcher before
any process starts and by each group's ranks before they build anything."""

from __future__ import annotations

import os

from kenotron.config import JobConfig
from kenotron.errors import ConfigError

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""torchft's own variable for the lighthouse's address (its Manager reads it when none is given)."""


def lighthouse_address(cfg: JobConfig, environ: dict[str, str] | os._Environ = os.environ) -> str:
    """The lighthouse this group reports to: fault_tolerance.lighthouse, else $TORCHFT_LIGHTHOUSE."""
    chosen = cfg.fault_tolerance.lighthouse
    return chosen if chosen and chosen != "start" else environ.get(LIGHTHOUSE_ENV, "")


def check_fault_tolerance(cfg: JobConfig) -> None:
    """ConfigError (one line, with the fix) for a `[fault_tolerance]` section that cannot run."""
    ft = cfg.fault_tolerance
    if not ft.enable:
        return
    if ft.replica_id >= ft.replica_groups:
        raise ConfigError(f"fault_tolerance.replica_id={ft.replica_id} must be below fault_tolerance.replica_groups="
                          f"{ft.replica_groups}: give each group an index from 0 to {ft.replica_groups - 1}")
    if ft.min_replicas > ft.replica_groups:
        raise ConfigError(f"fault_tolerance.min_replicas={ft.min_replicas} is more than the "
                          f"{ft.replica_groups} replica groups: no step could commit; set it to at most "
                          f"{ft.replica_groups}")
    if cfg.parallelism.dp_replicate != 1:
        raise ConfigError(f"parallelism.dp_replicate={cfg.parallelism.dp_replicate} with fault_tolerance.enable: the "
                          f"replica groups are the replicate dimension; set parallelism.dp_replicate=1 and "
                          f"fault_tolerance.replica_groups={cfg.parallelism.dp_replicate * ft.replica_groups}")
    if cfg.parallelism.dp_mode == "zero1":
        raise ConfigError("parallelism.dp_mode=\"zero1\" with fault_tolerance.enable: ZeRO-1's optimizer state is "
                          "split over ranks the groups do not share; use dp_mode \"fsdp\" inside each group")
    if ft.sync_every > 1 and cfg.parallelism.pp > 1:
        raise ConfigError(f"fault_tolerance.sync_every={ft.sync_every} (DiLoCo) takes one model part, "
                          f"parallelism.pp={cfg.parallelism.pp} makes several; set parallelism.pp=1 or "
                          f"fault_tolerance.sync_every=1")
    if not ft.lighthouse and not os.environ.get(LIGHTHOUSE_ENV):
        raise ConfigError("fault_tolerance.enable needs a lighthouse: set fault_tolerance.lighthouse to its "
                          "http://host:port (start one with `torchft_lighthouse --min_replicas 1`), or \"start\" "
                          "for the launcher to start one on this host, or set TORCHFT_LIGHTHOUSE")
