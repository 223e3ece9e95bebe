"""A DTensor's local shard or full value, and a plain tensor as it is, and the forgetting of
DTensor's caches between jobs; imports nothing else of kenotron, so every room (kernels included)
uses these instead of writing its own."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, _random, _redistribute, debug


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (no communication); any other tensor unchanged."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered into its full value on every rank (a collective); any other tensor unchanged."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def forget_dtensor_caches() -> None:
    """Drop DTensor's caches keyed by DeviceMesh: sharding decisions (the Python cache and the C++
    fast path's), tensor metadata, redistribution plans and the random-op tracker.

    Meshes compare equal by shape and names, not by process group. A job that builds its meshes
    after another in the same process (a notebook, the estimator's next fake group, the test
    pool) would get that job's cached outputs for its own tensors: `nn.Parameter(dtensor)` and
    `to_empty` return DTensors on the earlier job's mesh, whose groups may be destroyed (a routed
    expert outside FSDP then fails at gradient clipping: "Could not resolve the process group").
    The names are private and differ between torch versions: each is cleared where it exists."""
    clear_all = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear_all is not None:  # the Python cache and the C++ fast path's
        clear_all()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached", "_propagate_tensor_meta"):
        clear = getattr(getattr(propagator, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    for clear in (getattr(_redistribute, "clear_redistribute_planner_cache", None),
                  getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None)):
        if clear is not None:
            clear()
    _random._rng_tracker = None  # made again, on this job's mesh, by the next random DTensor op
