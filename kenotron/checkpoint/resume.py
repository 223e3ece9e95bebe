"""Rank 0's decisions when a run starts: which checkpoint to load, and what becomes of later ones.

`choose` picks the checkpoint (`checkpoint.load_step`: -1 the latest complete full checkpoint,
local or remote; N that step; 0 none; else `checkpoint.initial_load_path`). A model-only export
is never picked by -1: it holds no optimizer, schedule or data position, so resuming from it
would silently restart training. `abandon_later` then moves every checkpoint above the step the
run continues from out of the way (lineage.py says why), locally and in the bucket.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kenotron.checkpoint.errors import CheckpointError, RemoteStorageError
from kenotron.checkpoint.folders import (
    StepFolder,
    check_checkpoint,
    list_step_folders,
    parse_step,
    remove_step_folder,
)
from kenotron.checkpoint.lineage import ABANDONED_PREFIX, later_steps, set_aside
from kenotron.checkpoint.remote import S3Store, is_remote
from kenotron.config.sections import Checkpoint as CheckpointConfig

logger = logging.getLogger("kenotron")


@dataclass(frozen=True)
class LoadChoice:
    """The checkpoint a run starts from."""

    path: str
    step: int
    model_only: bool
    """Load only the model (an export, or initial_load_path with initial_load_model_only)."""
    initial: bool = False
    """From checkpoint.initial_load_path: the run itself starts at step 0."""


def choose(config: CheckpointConfig, folder: Path, wanted: int, store: S3Store | None) -> LoadChoice | None:
    """The checkpoint to load, or None to start from scratch; on rank 0 (may download)."""
    if wanted == 0:
        return None
    local = {f.step: f for f in list_step_folders(folder)}
    complete = sorted(s for s, f in local.items() if f.complete)
    remote = remote_steps(store, config.remote_delete_local, folder) if store is not None else []
    if wanted > 0:
        if wanted in complete:
            return _local_choice(local[wanted].path, wanted, explicit=True)
        if wanted in remote:
            return _local_choice(store.download_step(wanted, folder), wanted, explicit=True)
        if wanted in local:
            check_checkpoint(local[wanted].path)  # raises with the reason it is not loadable
        raise CheckpointError(
            f"checkpoint.load_step={wanted}: no complete checkpoint of step {wanted} in {folder}"
            f"{' or ' + str(store.location) if store else ''}; complete steps: {sorted(set(complete) | set(remote))} "
            f"(-1 picks the latest)"
        )
    full_local = [s for s in complete if not local[s].model_only]
    best_local = max(full_local, default=None)
    best_remote = None
    for step in sorted((s for s in remote if s not in local and (best_local is None or s > best_local)), reverse=True):
        if not store.is_model_only(step):
            best_remote = step
            break
    exports = [s for s in complete if local[s].model_only]
    if best_remote is not None:
        return LoadChoice(str(store.download_step(best_remote, folder)), best_remote, model_only=False)
    if best_local is not None:
        return LoadChoice(str(local[best_local].path), best_local, model_only=False)
    if exports:
        logger.warning(
            "%s holds only model-only exports (%s), which are not resumed from (no optimizer, schedule or data "
            "position); this run starts from scratch. Start from one with checkpoint.initial_load_path",
            folder, ", ".join(local[s].path.name for s in exports),
        )
    return _initial_choice(config, folder)


def _local_choice(path: Path, step: int, *, explicit: bool) -> LoadChoice:
    model_only = StepFolder(Path(path), step, complete=True).model_only
    if model_only and explicit:
        logger.warning("%s is a model-only export: only the weights load; the optimizer, the LR schedule, the data "
                       "position and the step start fresh", path)
    return LoadChoice(str(path), step, model_only=model_only)


def _initial_choice(config: CheckpointConfig, folder: Path) -> LoadChoice | None:
    initial = config.initial_load_path
    if not initial:
        return None
    if is_remote(initial):
        parent, _, name = initial.rstrip("/").rpartition("/")
        step = parse_step(name)
        if step is None:
            raise CheckpointError(f"checkpoint.initial_load_path={initial!r} must end in a step folder like step-000100")
        # Into a subfolder: not a step folder of this run, so never mistaken for one on resume.
        initial = str(S3Store(parent, config.remote_endpoint_url).download_step(step, folder / "initial"))
    return LoadChoice(initial, -1, model_only=config.initial_load_model_only, initial=True)


def remote_steps(store: S3Store, delete_local: bool, folder: Path) -> list[int]:
    """Complete steps in the bucket. When local copies are kept, an unreachable bucket only
    costs its steps (training goes on from local ones); when they are deleted after upload
    the bucket is the only copy, and starting afresh without it would be wrong."""
    try:
        return store.complete_steps()
    except RemoteStorageError as exc:
        if delete_local:
            raise
        logger.error("%s; resuming from the local checkpoints in %s only", exc, folder)
        return []


def abandon_later(folder: Path, resume_step: int, store: S3Store | None) -> None:
    """Move complete checkpoints above `resume_step` aside (locally and in the bucket) and delete
    kenotron's interrupted saves above it; one warning says what moved where."""
    later = later_steps(folder, resume_step)
    for f in later:
        if not f.complete:
            remove_step_folder(f.path)
    moved = [f for f in later if f.complete]
    target = set_aside(folder, moved, resume_step) if moved else None
    remote: list[int] = []
    if store is not None:
        remote = [s for s in remote_steps(store, False, folder) if s > resume_step]
        if remote:
            name = (target.name if target is not None else
                    f"{ABANDONED_PREFIX}remote-after-step-{resume_step:06d}")
            store.set_aside(remote, name)
    if moved or remote:
        where = []
        if moved:
            where.append(f"{', '.join(f.path.name for f in moved)} to {target}")
        if remote:
            where.append(f"remote step(s) {remote} under {store.location}/{name}/")
        logger.warning(
            "this run continues from step %d, so the later checkpoints of the continuation it abandons are set aside "
            "(never loaded, never deleted by kenotron): %s", resume_step, "; ".join(where),
        )
