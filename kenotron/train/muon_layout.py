"""Orthogonalizing sharded matrices whole: Muon's step under FSDP, TP, EP and their mixes.

Newton–Schulz must see a whole matrix (the orthogonal form of a shard is not a shard of the
orthogonal form). Two ways to get there, both from the shards each rank holds:

- "owner" (the default): same-shape matrices are stacked into a batch (k, m, n) whose shards
  lie on the matrix dimensions; one redistribution moves the batch to Shard(0) on every mesh
  dimension that shards it, an all-to-all after which each rank holds about k / W *whole*
  matrices. Each rank orthogonalizes only those, and the reverse all-to-all brings every rank
  its shards back. Per rank and matrix of size M over W ranks: 2 (W - 1) M / W^2 elements sent
  and received, and M / W of Newton–Schulz work.
- "every_rank": every matrix all-gathered on every rank ((W - 1) M / W received), each rank
  orthogonalizes every matrix and keeps its shard: W / 2 times the traffic of "owner" (equal at
  W = 2) and W times the compute. Kept as the simple reference and for W = 2 measurements.

A 3-D parameter is already a batch of matrices (MoE experts, (experts, out, in)); its own
placements stay on the dimensions they are (expert parallel's Shard(0) keeps whole experts
where they are) and only the matrix dimensions' shards move. Replicated mesh dimensions
(HSDP's replicas, a matrix tensor parallel leaves whole) stay replicated: each replica
computes what it needs. Plain tensors (no mesh) are orthogonalized where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

NsFn = Callable[[torch.Tensor], torch.Tensor]
Redistribution = Literal["owner", "every_rank"]


def _is_strided(placement) -> bool:
    """FSDP's shard of a dimension tensor parallel already shards (a Shard subclass in some
    torch versions, not in others: known by name, as grad_norm.py does)."""
    return type(placement).__name__ == "_StridedShard"


def _shift(placement, by: int):
    """The placement of a tensor after `by` leading dimensions were added (a stacked batch)."""
    if _is_strided(placement):
        return type(placement)(placement.dim + by, split_factor=placement.split_factor)
    if isinstance(placement, Shard):
        return Shard(placement.dim + by)
    if isinstance(placement, Partial):
        raise RuntimeError("Muon got a Partial DTensor update: reduce gradients before the optimizer step")  # noqa: TRY004
    return placement


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))


def _batched_dtensor(locals_: list[torch.Tensor], like: DTensor) -> DTensor:
    """A DTensor of the matrices whose shards are `locals_` (each shaped like `like`'s local
    part), stacked on a new dimension 0 that no mesh dimension shards."""
    stacked = torch.stack(locals_) if len(locals_) > 1 or like.ndim == 2 else locals_[0]
    if like.ndim == 2:
        placements = [_shift(p, 1) for p in like.placements]
        shape = (len(locals_), *like.shape)
    else:
        placements = [_shift(p, 0) for p in like.placements]
        shape = tuple(like.shape)
    return DTensor.from_local(stacked, like.device_mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=_contiguous_stride(shape))


def _owner_placements(batch: DTensor, gathered: set[int]) -> list:
    """Whole matrices on each rank: every sharding mesh dimension, and those `gathered` (see
    below), splits the batch dimension."""
    return [Shard(0) if (isinstance(p, Shard) and not _is_strided(p)) or i in gathered else Replicate()
            for i, p in enumerate(batch.placements)]


def orthogonalize_dtensors(updates: list[DTensor], ns: NsFn, how: Redistribution, dtype: torch.dtype,
                           ) -> list[torch.Tensor]:
    """The local shards of the orthogonalized `updates` (DTensors of one local shape, mesh and
    placements; 2-D matrices, or one 3-D batch of matrices), in `dtype`.

    A strided shard (FSDP over a dimension tensor parallel already shards: _StridedShard) is
    first gathered over its mesh dimension (DTensor's redistribution from it to a Shard of
    another dimension is not reliable in torch 2.11-2.13), the batch is then split over that
    dimension too, and at the end each rank cuts its strided shard out of the gathered one
    (a contiguous block: nested chunks of one dimension), by the offsets DCP also uses.
    """
    like, mesh = updates[0], updates[0].device_mesh
    gathered = {i for i, p in enumerate(like.placements) if _is_strided(p)}
    plain = [Replicate() if i in gathered else p for i, p in enumerate(like.placements)]
    if gathered:
        updates = [u.redistribute(mesh, plain) for u in updates]
    locals_ = [u.to_local().to(dtype) for u in updates]
    batch = _batched_dtensor(locals_, updates[0])
    if how == "every_rank":
        full = ns(batch.full_tensor())
        out = distribute_tensor(full, mesh, batch.placements, src_data_rank=None).to_local()
    else:
        owned = batch.redistribute(mesh, _owner_placements(batch, gathered))
        done = DTensor.from_local(ns(owned.to_local()), mesh, owned.placements, run_check=False,
                                  shape=owned.shape, stride=owned.stride())
        out = done.redistribute(mesh, batch.placements).to_local()
    if gathered:
        shape, offset = compute_local_shape_and_global_offset(like.shape, mesh, like.placements)
        _, plain_offset = compute_local_shape_and_global_offset(like.shape, mesh, plain)
        lead = (slice(None),) if like.ndim == 2 else ()
        out = out[lead + tuple(slice(o - po, o - po + n) for o, po, n in zip(offset, plain_offset, shape))]
    return list(out.unbind(0)) if like.ndim == 2 else [out]


def orthogonalize(updates: list[torch.Tensor], ns: NsFn, how: Redistribution, dtype: torch.dtype,
                  ) -> list[torch.Tensor]:
    """The orthogonalized form of each update (a matrix or a 3-D batch of matrices), as this rank's
    local part, in `dtype`. Same-shape DTensors on one mesh and placements go in one batch; the
    order of `updates` must be the same on every rank of a mesh (it is: each rank lists its
    parameters in the model's order)."""
    out: list[torch.Tensor | None] = [None] * len(updates)
    buckets: dict[tuple, list[int]] = {}
    for i, u in enumerate(updates):
        if isinstance(u, DTensor) and u.device_mesh.size() > 1:
            # 3-D parameters are batches of their own (their placements may shard dimension 0).
            key = (tuple(u.shape), u.device_mesh, tuple(u.placements), i if u.ndim == 3 else -1)
        else:
            key = (tuple(u.shape), None, (), -1)
        buckets.setdefault(key, []).append(i)
    for (_, mesh, _, _), idx in buckets.items():
        if mesh is None:
            # Local tensors (a leading batch dimension more for 2-D ones; 3-D ones already have one).
            done = ns(torch.stack([u.to_local() if isinstance(u, DTensor) else u for u in (updates[i] for i in idx)]))
            for j, i in enumerate(idx):
                out[i] = done[j]
        else:
            for i, o in zip(idx, orthogonalize_dtensors([updates[i] for i in idx], ns, how, dtype)):
                out[i] = o
    return out  # type: ignore[return-value]
