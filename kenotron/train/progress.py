"""Progress for the user: what a launch has left to do, and bars for long work outside the loop.

The training loop's own progress is the record line (train/metrics.py: step/total, ETA). Long
work elsewhere (conversion, estimation's search, generation) shows a tqdm bar on a terminal and
stays silent when its output goes to a file or a pipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from kenotron.config import JobConfig

T = TypeVar("T")


def nothing_to_do(step: int, cfg: JobConfig) -> str:
    """The line for a launch that resumed at or past its last step."""
    return (f"nothing to do: the run in {cfg.job.dump_folder} is at step {step} and training.steps is "
            f"{cfg.training.steps}; raise training.steps (e.g. --training.steps {max(step, cfg.training.steps) * 2}) "
            f"to train further")


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool | None = None) -> Iterator[T]:
    """`items` with a tqdm bar on stderr when it is a terminal (`enabled=None`), else plain."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency; a bare environment still works without the bar
        yield from items
        return
    bar: Any = tqdm(items, total=total, desc=desc, unit=unit, disable=None if enabled is None else not enabled,
                    leave=False, dynamic_ncols=True)
    try:
        yield from bar
    finally:
        bar.close()
