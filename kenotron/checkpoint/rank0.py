"""Rank 0 decides, every rank learns the answer: the checkpoint manager's folder work (making a
step folder, choosing what to load, setting later checkpoints aside) runs once, on one filesystem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def on_rank0_for_all(fn: Callable[..., Any], *args: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Run `fn(*args)` on `group`'s rank 0 (default: the world's) and give every rank its result,
    or raise its error on every rank; without a process group, just run it."""
    if not (dist.is_available() and dist.is_initialized()):
        return fn(*args)
    box: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:
            box[0] = ("ok", fn(*args))
        # Any error must reach the other ranks (re-raised on all of them below); an escape
        # here would leave them hanging in broadcast_object_list.
        except Exception as exc:  # noqa: BLE001
            box[0] = ("error", exc)
    source = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=source, group=group)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value
