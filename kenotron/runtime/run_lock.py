"""One live job per run folder.

Two jobs writing into one `job.dump_folder` (a restart while the previous job still runs, or
workers orphaned by a killed launcher) interleave metrics and race on checkpoints: the older
job's rotation can delete the newer job's saves. Rank 0 of a job therefore holds a lock on
`<dump_folder>/.kenotron.lock` (and on the checkpoint folder's, when it lies elsewhere) for the
job's whole life; a second job fails at once with one line naming the holder.

The lock is a POSIX record lock (`fcntl.lockf`): the kernel drops it when the holding process
exits, however it exits (SIGKILL included), so a dead job never leaves a stale lock, and it
works across the nodes of NFS v4 and Lustre. Locks belong to processes: a second trainer in
the same process (a notebook) shares its folder's lock, and closing either releases it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from kenotron.config import ConfigError

LOCK_NAME = ".kenotron.lock"


class RunFolderBusyError(ConfigError):
    """Another live job holds the run folder."""


class RunFolderLock:
    """The lock of one folder, held from `acquire()` to `release()` (or the process's end)."""

    def __init__(self, folder: str | Path, setting: str = "job.dump_folder") -> None:
        self.folder = Path(folder)
        self.setting = setting
        self._fd: int | None = None

    def acquire(self) -> RunFolderLock:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise RunFolderBusyError(
                f"{self.setting}={str(self.folder)!r} is in use by another live job ({_describe_holder(path)}); "
                f"wait for it to end, stop it, or give this job another {self.setting}"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def _describe_holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def lock_run_folders(dump_folder: str | Path, checkpoint_folder: str | Path | None) -> list[RunFolderLock]:
    """Locks on the dump folder and, when it lies outside it, the checkpoint folder."""
    locks = [RunFolderLock(dump_folder).acquire()]
    if checkpoint_folder is not None:
        inside = Path(checkpoint_folder).resolve().is_relative_to(Path(dump_folder).resolve())
        if not inside:
            try:
                locks.append(RunFolderLock(checkpoint_folder, "checkpoint.folder").acquire())
            except BaseException:
                locks[0].release()
                raise
    return locks
