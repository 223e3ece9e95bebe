"""Small temporary filesystems for fault tests: a real tmpfs where this process may mount one
(root, Linux), else the test is skipped (the injected-error tests beside it always run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def small_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """A fresh tmpfs of `size_kib` KiB mounted at `path` (unmounted after)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    path.mkdir(parents=True, exist_ok=True)
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path))
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def make_read_only(path: Path) -> None:
    _mount("-o", "remount,ro", str(path))


def fill(path: Path, leave_kib: int) -> None:
    """Fill the filesystem of `path` until about `leave_kib` KiB are free."""
    free = shutil.disk_usage(path).free
    with open(path / "filler.bin", "wb") as f:
        f.write(b"\0" * max(free - leave_kib * 1024, 0))
