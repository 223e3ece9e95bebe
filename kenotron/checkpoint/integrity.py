"""The size (and optionally the SHA-256) of every file of a checkpoint, recorded in its marker.

Sizes are always recorded and checked: a file cut short or grown after the save is named
before DCP reads it. With `checkpoint.checksums` rank 0 also reads every file back after the
save and records its SHA-256, and loading verifies them (on rank 0, before any rank reads a
byte): a file damaged in place (same size, e.g. a flipped bit or bytes overwritten with
+Inf values) is refused instead of loaded. A checksum guards against accidents, not against an
attacker who can also rewrite the marker (see docs/checkpointing.md for what must be trusted).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kenotron.checkpoint.errors import CheckpointFormatError

_CHUNK = 16 << 20
_NOT_RECORDED = ("COMPLETE.json", "COMPLETE.json.tmp")


def describe_files(path: str | Path, *, checksums: bool) -> dict[str, dict[str, Any]]:
    """{relative name: {"size": bytes[, "sha256": hex]}} of every file of the step folder but its marker."""
    root = Path(path)
    files: dict[str, dict[str, Any]] = {}
    for file in sorted(p for p in root.rglob("*") if p.is_file() and p.name not in _NOT_RECORDED):
        entry: dict[str, Any] = {"size": file.stat().st_size}
        if checksums:
            entry["sha256"] = sha256_of(file)
        files[file.relative_to(root).as_posix()] = entry
    return files


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_sizes(path: str | Path, marker: dict[str, Any]) -> None:
    """CheckpointFormatError naming the first recorded file that is missing or of another size."""
    for name, info in sorted((marker.get("files") or {}).items()):
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointFormatError(
                f"{path} is damaged: file {name} that the save wrote is missing; load an earlier step or restore it"
            )
        size = file.stat().st_size
        if size != info.get("size", size):
            raise CheckpointFormatError(
                f"{path} is damaged: file {name} has {size} bytes but the save wrote {info['size']}; load an earlier "
                f"step or restore it"
            )


def verify_checksums(path: str | Path, marker: dict[str, Any]) -> None:
    """Check the recorded sizes and, where recorded, SHA-256 sums (reads every file once)."""
    check_sizes(path, marker)
    for name, info in sorted((marker.get("files") or {}).items()):
        expected = info.get("sha256")
        if expected and sha256_of(Path(path) / name) != expected:
            raise CheckpointFormatError(
                f"{path} is damaged: the content of {name} changed since it was saved (SHA-256 differs, same size); "
                f"load an earlier step or restore the file from a good copy"
            )
