"""Plain-words causes of failed saves: which rank, which OS error, whether the disk is full.

DCP reports a failed save as `CheckpointException` (a BaseException, not an Exception) whose
`failures` map each failing rank to its exception; a full disk often surfaces as a torch
serialization error ("unexpected pos 704 vs 598") with the OSError lost. So the cause is taken
from the first OSError found in the failures, and the free space of the folder's disk is
looked at whatever the error says.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

_PLAIN_ERRNO = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or folder",
    errno.EIO: "input/output error (a failing disk or network filesystem)",
}
FULL_BELOW_BYTES = 64 << 20
"""A disk with less free space than this after a failed write is reported as full."""


def is_checkpoint_exception(exc: BaseException) -> bool:
    """DCP's CheckpointException, without importing it where DCP is absent."""
    return type(exc).__name__ == "CheckpointException" and hasattr(exc, "failures")


def explain_os_error(exc: OSError) -> str:
    """`no space left on the device (errno 28: ...)`, or the error's own text."""
    plain = _PLAIN_ERRNO.get(exc.errno or -1)
    text = exc.strerror or str(exc)
    where = f" at {exc.filename}" if exc.filename else ""
    return f"{plain}{where} ({text})" if plain else f"{type(exc).__name__}{where}: {text}"


def root_causes(exc: BaseException) -> dict[int | None, BaseException]:
    """{rank: exception} of a CheckpointException (None: the rank is unknown), else {None: exc}."""
    if is_checkpoint_exception(exc):
        out: dict[int | None, BaseException] = {}
        for rank, failure in sorted(exc.failures.items()):
            out[rank] = failure[0] if isinstance(failure, tuple) else failure
        return out or {None: exc}
    return {None: exc}


def first_os_error(exc: BaseException) -> OSError | None:
    """The first OSError in `exc`'s chain of causes (DCP wraps them in RuntimeErrors)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def free_bytes(folder: str | Path) -> int | None:
    """Free bytes on the disk holding `folder` (or its nearest existing parent); None if unknown."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def describe_save_failure(exc: BaseException, folder: str | Path) -> str:
    """One sentence: which ranks failed and why, with the fix for a full or read-only disk."""
    causes = root_causes(exc)
    ranks = sorted(r for r in causes if r is not None)
    first = next(iter(causes.values()))
    os_error = next((e for e in (first_os_error(c) for c in causes.values()) if e is not None), None)
    why = explain_os_error(os_error) if os_error is not None else f"{type(first).__name__}: {_first_line(str(first))}"
    on = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    text = f"failed{on}: {why}"
    free = free_bytes(folder)
    if (os_error is not None and os_error.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        free is not None and free < FULL_BELOW_BYTES
    ):
        shown = "unknown" if free is None else format_bytes(free)
        text += (f"; the disk holding {folder} is full ({shown} free): free space, lower checkpoint.keep_latest_k, "
                 f"or point checkpoint.folder at a larger disk")
    elif os_error is not None and os_error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        text += f"; make {folder} writable or point checkpoint.folder elsewhere"
    return text


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "no details"
