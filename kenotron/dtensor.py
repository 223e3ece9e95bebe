"""A DTensor's local shard or full value, and a plain tensor as it is; imports nothing else of
kenotron, so every room (kernels included) uses these two instead of writing its own."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (no communication); any other tensor unchanged."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered into its full value on every rank (a collective); any other tensor unchanged."""
    return t.full_tensor() if isinstance(t, DTensor) else t
