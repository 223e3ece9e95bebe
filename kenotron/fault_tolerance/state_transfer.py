"""The run's state as plain tensors for a recovering replica group, and back into this group's layout.

torchft's HTTP transport pickles what it sends. A DTensor pickles its device mesh, which names
this process's groups: meaningless to the receiver. Every group has the same layout, so rank r
of the recovering group needs exactly rank r's local shards of a live group: each DTensor
travels as its local tensor, and the receiver rebuilds it on its own mesh with its own
placements (its state_dict of the same parts gives them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from kenotron.dtensor import local_tensor


def local_state(parts: Mapping[str, Any]) -> dict[str, Any]:
    """{part name: its state_dict with every DTensor replaced by this rank's local tensor}, detached."""
    out = {}
    for name, part in parts.items():
        values, spec = tree_flatten(part.state_dict())
        out[name] = tree_unflatten([local_tensor(v).detach() if isinstance(v, torch.Tensor) else v
                                    for v in values], spec)
    return out


def _rebuild(received: Any, ours: Any, where: str) -> Any:
    """`received` (a local tensor) as `ours` is: a DTensor on our mesh and placements, on our device."""
    if isinstance(ours, DTensor):
        local = ours.to_local()
        if tuple(received.shape) != tuple(local.shape):
            raise RuntimeError(f"{where}: a peer sent a local shard of shape {tuple(received.shape)}, this rank "
                               f"holds {tuple(local.shape)}: the replica groups must have the same layout")
        return DTensor.from_local(received.to(local.device, local.dtype), ours.device_mesh, ours.placements,
                                  shape=ours.shape, stride=ours.stride())
    if isinstance(ours, torch.Tensor) and isinstance(received, torch.Tensor):
        return received.to(ours.device)
    return received


def load_local_state(parts: Mapping[str, Any], received: Mapping[str, Any]) -> None:
    """Load what `local_state` gave on a peer into `parts` (same names, same layout on every group)."""
    for name, part in parts.items():
        if name not in received:
            raise RuntimeError(f"a peer's state has no part {name!r} (it has {sorted(received)}): the replica "
                               "groups must run the same config")
        theirs = received[name]
        ours = part.state_dict()  # the structure, and each DTensor's mesh and placements
        if isinstance(theirs, dict) and isinstance(ours, dict):
            merged = {key: _rebuild(value, ours.get(key), f"{name}.{key}") for key, value in theirs.items()}
        else:
            merged = theirs
        part.load_state_dict(merged)
