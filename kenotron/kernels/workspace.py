"""Scratch memory of kenotron's custom ops, for the memory estimator.

A custom op's fake implementation runs below the estimator's tracker (a dispatch mode,
estimate/tracker.py): the tracker sees the op's outputs but not the buffers its kernels
allocate and free inside. Each op with such buffers registers a function of its arguments
giving the bytes of each buffer; the tracker books them (rounded as the CUDA caching allocator
rounds blocks) as temporaries held while the op runs, beside its inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Callable

_SCRATCH_BUFFERS: dict[str, Callable[..., list[int]]] = {}


def register_scratch(op_name: str, buffers_of: Callable[..., list[int]]) -> None:
    """`op_name` as torch names it ("kenotron::ssd_scan"); `buffers_of` takes the op's arguments
    and gives the bytes of each buffer its kernels allocate."""
    _SCRATCH_BUFFERS[op_name] = buffers_of


def scratch_buffers(func, args: tuple, kwargs: dict | None = None) -> list[int]:
    """The registered scratch buffers' bytes of the op overload `func` called with these arguments."""
    name = func.name() if hasattr(func, "name") else ""
    buffers_of = _SCRATCH_BUFFERS.get(name)
    return buffers_of(*args, **(kwargs or {})) if buffers_of is not None else []
