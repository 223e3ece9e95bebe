"""For the interpreter scripts of kernels that leave rows unwritten: the launchers' outputs
(torch.empty / torch.empty_like) start as a sentinel value instead of whatever memory held, so a
script can tell the rows a kernel wrote from those it left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

SENTINEL = 7.0


@contextmanager
def outputs_start_as_sentinel() -> Iterator[None]:
    empty, empty_like = torch.empty, torch.empty_like
    torch.empty = lambda *a, **kw: empty(*a, **kw).fill_(SENTINEL)
    torch.empty_like = lambda *a, **kw: empty_like(*a, **kw).fill_(SENTINEL)
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
