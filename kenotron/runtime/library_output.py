"""torch's own console output (its warnings and log lines) sent to a run's log file, or dropped.

A kenotron command's console holds kenotron's lines. torch adds its own: `warnings.warn` from its
files ("torch.distributed is disabled ... assuming the intent is to save in a single process"
on every single-process save), and lines of its loggers (device_mesh's, DCP's), which torch
prints through stderr handlers it attaches to its loggers at import. While

    with library_output_to(Path(dump_folder) / "logs" / "rank0_torch.log"):   # or None: dropped
        ...

is open, those lines go to the file (created on the first one) and nowhere else; kenotron's own
logger and warnings raised from kenotron's or the user's code are untouched. On leaving, the
console output of torch is as it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

_FORMAT = logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s")


def _torch_folder() -> str | None:
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return os.path.dirname(os.path.abspath(file)) + os.sep if file else None


class _Sink:
    """Appends lines to `path` (opened on the first), or drops them when `path` is None."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: TextIO | None = None

    def write(self, text: str) -> None:
        if self.path is None:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a")  # noqa: SIM115 - held until close()
            self._file.write(text.rstrip("\n") + "\n")
            self._file.flush()
        except OSError:
            self.path = None  # an unwritable log folder: drop torch's lines rather than fail the command

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class _ToSink(logging.Filter):
    """On torch's console handlers: the record goes to the sink instead of the console."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        self.sink.write(_FORMAT.format(record))
        return False


def _torch_console_handlers() -> list[logging.Handler]:
    """The stream handlers torch attached to its loggers ("torch" and the ones it registered)."""
    handlers = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger):
            handlers += [h for h in logger.handlers if isinstance(h, logging.StreamHandler)
                         and not isinstance(h, logging.FileHandler) and h not in handlers]
    return handlers


@contextlib.contextmanager
def library_output_to(path: Path | None) -> Iterator[None]:
    """While open, torch's warnings and log lines go to `path`, or are dropped (None); module docstring."""
    sink = _Sink(path)
    torch_folder = _torch_folder()
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        folder = torch_folder or _torch_folder()
        if folder and os.path.abspath(filename).startswith(folder):
            sink.write(f"{filename}:{lineno}: {category.__name__}: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    to_sink = _ToSink(sink)
    handlers = _torch_console_handlers()
    warnings.showwarning = show
    for handler in handlers:
        handler.addFilter(to_sink)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(to_sink)
        if warnings.showwarning is show:
            warnings.showwarning = shown
        sink.close()
