"""What the ranks of a worker pool print: each rank writes its stdout and stderr to two files of
the pool's log folder (tests/distributed/worker.py); the parent reads what a call added, from
where the last read stopped, and repeats it on its own streams with a `[rank N] ` prefix, so that
pytest shows it with the test (and a failing rank's stderr tail goes into the error)."""

from __future__ import annotations

import os
import sys
from typing import Any


class RankOutput:
    """The output files of `world_size` ranks in `log_dir`, read from the last mark on."""

    def __init__(self, log_dir: str, world_size: int) -> None:
        self.log_dir = log_dir
        self.world_size = world_size
        self._files: list[tuple[Any, Any]] = []
        self._offsets: list[tuple[int, int]] = [(0, 0)] * world_size

    def _open(self) -> None:
        if not self._files:
            for r in range(self.world_size):
                base = os.path.join(self.log_dir, f"rank{r}")
                # Kept open across calls (read from the last offset each time); closed in close().
                self._files.append((open(base + ".out", "rb"), open(base + ".err", "rb")))  # noqa: SIM115

    def mark(self) -> None:
        """Start the next read from here (before a call: its output alone is read after it)."""
        self._open()
        self._offsets = [(os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size)
                         for out, err in self._files]

    def read(self) -> list[tuple[str, str]]:
        """New output of each rank since the last mark, as (stdout, stderr); marks again."""
        try:
            self._open()
        except OSError:
            return [("", "")] * self.world_size
        texts = []
        for (out, err), (o_off, e_off) in zip(self._files, self._offsets):
            pair = []
            for f, off in ((out, o_off), (err, e_off)):
                f.seek(off)
                pair.append(f.read().decode("utf-8", errors="replace"))
            texts.append(tuple(pair))
        self.mark()
        return texts

    def forward(self) -> list[tuple[str, str]]:
        """Read the new output and print it on this process's streams, each line as `[rank N] line`."""
        outputs = self.read()
        for rank, (out, err) in enumerate(outputs):
            for text, stream in ((out, sys.stdout), (err, sys.stderr)):
                if text:
                    prefix = f"[rank {rank}] "
                    stream.write("".join(prefix + line for line in text.splitlines(True)))
                    if not text.endswith("\n"):
                        stream.write("\n")
                    stream.flush()
        return outputs

    def close(self) -> None:
        for out, err in self._files:
            out.close()
            err.close()
        self._files = []
