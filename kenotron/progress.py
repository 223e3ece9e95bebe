"""Progress bars for long work outside the training loop (conversion, estimation's search, generation).

The training loop's own progress is its record line (train/metrics.py: step/total, ETA). A bar is
drawn with tqdm on stderr when that is a terminal, and nothing is drawn when the output goes to a
file or a pipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool | None = None) -> Iterator[T]:
    """`items` with a tqdm bar on stderr when it is a terminal (`enabled=None`), else plain."""
    bar: Any = tqdm(items, total=total, desc=desc, unit=unit, disable=None if enabled is None else not enabled,
                    leave=False, dynamic_ncols=True)
    try:
        yield from bar
    finally:
        bar.close()


def progress_bar(total: int, *, desc: str = "", unit: str = "it") -> Any:
    """A bar advanced by hand (`.update()`, `.close()`), on a terminal only; otherwise a no-op."""
    return tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False, dynamic_ncols=True)
