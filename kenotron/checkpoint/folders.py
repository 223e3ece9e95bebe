"""Crash-safe checkpoint folders: one folder per step, visible only once its marker exists.

Layout of a checkpoint folder (`checkpoint.folder`):

    step-000100/            written by torch.distributed.checkpoint (DCP): .metadata, __r_i.distcp
        .kenotron-save      written first, by rank 0, before any data: "kenotron is writing here"
        COMPLETE.json       written last, by rank 0, once every rank's data and .metadata are on disk
    step-000200/            a save in progress, or one killed midway: no marker, never loaded

The marker is written to a temporary name, flushed and renamed, so it is either absent or whole.
Deleting a checkpoint removes the marker first, so a deletion that is interrupted leaves an
incomplete folder, never a "complete" one with files missing. Only folders that kenotron wrote
(a marker or the save stamp) are ever deleted or replaced: a `step-N` folder of anyone else is
left alone. A `step-N` that is a symbolic link is never deleted through: only the link itself
goes (another run's checkpoint it points to keeps its marker and its data).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.checkpoint import integrity
from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.checkpoint.trust import METADATA_NAME, read_metadata

logger = logging.getLogger("kenotron")

MARKER_NAME = "COMPLETE.json"
"""File whose presence makes a step folder a complete checkpoint."""
STAMP_NAME = ".kenotron-save"
"""Written into a step folder before any data: marks an interrupted save as kenotron's own."""
FORMAT_TAG = "kenotron-dcp/2"
"""Written into every marker; a marker without a known tag belongs to some other tool."""
LEGACY_FORMAT_TAGS = ("kenotron-dcp/1",)
"""Earlier formats still read: their model and optimizer load; see state.py for the rest."""

_STEP_FOLDER = re.compile(r"^step-(\d+)$")


def step_folder_name(step: int) -> str:
    """`step-000100`: zero-padded so that folders sort by step in a file browser too."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    return f"step-{step:06d}"


def parse_step(name: str) -> int | None:
    """The step of a folder named like `step-000100`; None for any other name."""
    match = _STEP_FOLDER.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class StepFolder:
    """One `step-NNNNNN` folder found on disk."""

    path: Path
    step: int
    complete: bool
    """Whether its completion marker exists (it may still be truncated: see check_checkpoint)."""

    @property
    def ours(self) -> bool:
        """Whether kenotron wrote it: a completion marker, or the stamp of an interrupted save."""
        return self.complete or (self.path / STAMP_NAME).is_file()

    @property
    def model_only(self) -> bool:
        """Whether it is a complete model-only export (checkpoint.last_save_model_only)."""
        if not self.complete:
            return False
        try:
            return bool(json.loads((self.path / MARKER_NAME).read_text()).get("model_only"))
        except (OSError, ValueError, AttributeError):
            return False  # a damaged marker: loading it says so; rotation treats it as a full one


def list_step_folders(folder: str | Path) -> list[StepFolder]:
    """Every `step-*` folder under `folder`, by increasing step (empty if `folder` is absent)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        step = parse_step(entry.name)
        if step is not None and entry.is_dir():
            found.append(StepFolder(entry, step, (entry / MARKER_NAME).is_file()))
    return sorted(found, key=lambda f: f.step)


def write_stamp(path: str | Path, step: int) -> None:
    """Mark a new step folder as kenotron's before any data is written into it."""
    body = {"step": step, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
            "pid": os.getpid()}
    (Path(path) / STAMP_NAME).write_text(json.dumps(body))


def write_marker(path: str | Path, content: dict[str, Any]) -> None:
    """Write the completion marker atomically (temporary file, fsync, rename, fsync of the folder)."""
    path = Path(path)
    body = {"format": FORMAT_TAG, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **content}
    tmp = path / (MARKER_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MARKER_NAME)
    _fsync_dir(path)


def read_marker(path: str | Path) -> dict[str, Any]:
    """The marker of a complete kenotron checkpoint; a clear error for anything else."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointFormatError(f"checkpoint folder {path} does not exist; check the path (or checkpoint.load_step)")
    marker = path / MARKER_NAME
    if not marker.is_file():
        if (path / METADATA_NAME).is_file():
            why = "it has DCP files but no completion marker: the save was interrupted (or it was written by another tool)"
        elif any(path.iterdir()):
            why = "it is not a kenotron checkpoint (no completion marker, no DCP .metadata)"
        else:
            why = "it is empty: a save was interrupted before writing anything"
        raise CheckpointFormatError(
            f"{path} cannot be loaded: {why}. Load an earlier complete step (leave checkpoint.load_step at -1 "
            f"to pick the latest complete one) or delete this folder"
        )
    try:
        content = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointFormatError(f"{marker} is not valid JSON ({exc}); the folder is damaged, delete it") from None
    if not isinstance(content, dict) or content.get("format") not in (FORMAT_TAG, *LEGACY_FORMAT_TAGS):
        found = content.get("format") if isinstance(content, dict) else type(content).__name__
        raise CheckpointFormatError(
            f"{marker} has format {found!r}, expected {FORMAT_TAG!r}: this folder was not written by this version "
            f"of kenotron's checkpointer"
        )
    return content


def read_dcp_metadata(path: str | Path) -> Any:
    """DCP's `Metadata` of a checkpoint folder, read without running code (trust.py), with a
    clear error when it is missing, damaged or crafted."""
    if not (Path(path) / METADATA_NAME).is_file():
        raise CheckpointFormatError(
            f"{path} has a completion marker but no {METADATA_NAME}: the folder is truncated; load an earlier "
            f"step or restore the file"
        )
    return read_metadata(path)


def check_checkpoint(path: str | Path, *, verify_checksums: bool = True) -> tuple[dict[str, Any], Any]:
    """Marker and DCP metadata of a checkpoint after checking that every data file is whole.

    The marker lists every file's size (and, with checkpoint.checksums, its SHA-256: verified
    here unless `verify_checksums` is False, e.g. when rank 0 has verified them for everyone).
    DCP's metadata records, for every stored item, the file and byte range holding it; a file
    that is missing or shorter than the last range it must hold means the folder was truncated
    (a partial copy, a full disk), which would otherwise surface as an obscure unpickling error.
    """
    marker = read_marker(path)
    metadata = read_dcp_metadata(path)
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointFormatError(
                f"{path} is truncated: data file {name} is missing; load an earlier step or restore the file"
            )
        size = file.stat().st_size
        if size < end:
            raise CheckpointFormatError(
                f"{path} is truncated: data file {name} has {size} bytes but the metadata needs {end}; load an "
                f"earlier step or restore the file"
            )
    if verify_checksums:
        integrity.verify_checksums(path, marker)
    else:
        integrity.check_sizes(path, marker)
    return marker, metadata


def remove_step_folder(path: str | Path) -> None:
    """Delete a checkpoint folder that kenotron wrote, marker first (see the module docstring).

    Raises CheckpointFormatError, deleting nothing, for a folder without marker or save stamp.
    A symbolic link is removed itself, never what it points to (see the module docstring).
    """
    path = Path(path)
    if path.is_symlink():
        logger.warning("%s is a symbolic link (to %s): removed the link only; kenotron never deletes through a link",
                       path, os.readlink(path))
        path.unlink()
        return
    if not path.is_dir():
        return
    if not ((path / MARKER_NAME).is_file() or (path / STAMP_NAME).is_file()):
        raise CheckpointFormatError(
            f"{path} was not written by kenotron (no {MARKER_NAME}, no {STAMP_NAME}), so kenotron does not delete "
            f"or replace it; move it out of the checkpoint folder, or use another checkpoint.folder"
        )
    (path / MARKER_NAME).unlink(missing_ok=True)
    _fsync_dir(path)
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; some filesystems refuse directory fds, which is harmless.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
