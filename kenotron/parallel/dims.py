"""The job's DeviceMesh: one named N-D mesh over the degrees of kenotron/degrees.py (which
checks them first, and says which dimensions and flattened views exist), the views the
plans look up by name, and cp's split into a ring and an all-to-all (`Meshes.split_cp`) for
parallelism.cp_scheme='ulysses' where the heads split over part of cp."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from kenotron.degrees import EP_MESH_DIM_ORDER, MESH_DIM_ORDER, ParallelDims
from kenotron.dtensor import forget_dtensor_caches


def build_device_meshes(dims: ParallelDims, device_type: str) -> Meshes:
    """The named mesh and its flattened views (the default process group must exist)."""
    names, sizes = dims.mesh_shape()
    if not names:
        return Meshes(dims, None)
    # A job's meshes equal an earlier job's of the same shape; DTensor's caches must not hand
    # this job's parameters that job's mesh and groups (kenotron/dtensor.py).
    forget_dtensor_caches()
    root = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    views: dict[str, DeviceMesh] = {}
    for flat_name, parts in dims.flattened_dims.items():
        present = tuple(p for p in parts if p in names)
        if len(present) > 1 or (flat_name == "ep" and present):
            # Keep the flattened mesh object: looking it up from the root later warns.
            views[flat_name] = root[present]._flatten(flat_name)
    return Meshes(dims, root, views)


@dataclass
class Meshes:
    """The job's DeviceMesh and the views the plans use, looked up by name.

    `get(name)` accepts a mesh dimension ("tp", "dp_shard", ...) or a flattened view ("dp",
    "dp_shard_cp", "dp_cp"); it returns None when that degree is 1 (no group needed), and
    the single existing dimension when a flattened view has only one part above 1.
    """

    dims: ParallelDims
    root: DeviceMesh | None
    views: dict[str, DeviceMesh] = field(default_factory=dict)
    cp_splits: dict[int, tuple[DeviceMesh, DeviceMesh]] = field(default_factory=dict, repr=False)
    """split_cp's meshes by all-to-all degree: each split creates process groups, so once per job."""

    def split_cp(self, ulysses: int) -> tuple[DeviceMesh, DeviceMesh]:
        """(ring, all-to-all) sub-meshes of the cp dimension for an all-to-all of `ulysses` ranks
        inside a ring of cp / ulysses (parallelism.cp_scheme='ulysses' with heads that split over
        part of cp: parallel/context/ulysses.py). cp rank j * ulysses + v is ring rank j and
        all-to-all rank v: the all-to-all on the nearer ranks, since nothing hides its traffic
        while the ring's transfers run under its compute. cp itself stays one dimension, so
        dp_shard_cp, dp_cp and the loss reductions span the whole cp group as before.

        Collective (every rank of the job creates the groups): call it at the same point on
        every rank. `_unflatten` is private in torch 2.11 and 2.13 alike, as `_flatten` is."""
        cp_mesh = self.get("cp")
        if cp_mesh is None or ulysses < 1 or cp_mesh.size() % ulysses:
            raise ValueError(f"an all-to-all of {ulysses} ranks cannot split the cp mesh {cp_mesh}; use a divisor "
                             f"of its size (parallelism.cp > 1)")
        if not hasattr(cp_mesh, "_unflatten"):  # present from torch 2.10 (pytorch#161224) through 2.13
            raise RuntimeError(f"torch {torch.__version__} has no DeviceMesh._unflatten to split cp into a ring and an "
                               f"all-to-all; use torch >= 2.11, parallelism.cp_scheme='ring', or a cp the heads divide")
        if ulysses not in self.cp_splits:
            split = cp_mesh._unflatten(0, (cp_mesh.size() // ulysses, ulysses), ("cp_ring", "cp_ulysses"))
            self.cp_splits[ulysses] = (split["cp_ring"], split["cp_ulysses"])
        return self.cp_splits[ulysses]

    def get(self, name: str) -> DeviceMesh | None:
        if self.root is None:
            return None
        names = self.root.mesh_dim_names or ()
        if name in names:
            return self.root[name]
        if name in self.views:
            return self.views[name]
        flattened = self.dims.flattened_dims
        if name in flattened:
            present = [p for p in flattened[name] if p in names]
            return self.root[present[0]] if len(present) == 1 else None
        if name in MESH_DIM_ORDER or name in EP_MESH_DIM_ORDER or name == "ep":
            return None
        raise KeyError(f"unknown mesh dimension {name!r}; use one of {MESH_DIM_ORDER + tuple(flattened)}")

    def coordinate(self, name: str) -> int:
        """This rank's index along a dimension or flattened view (0 when absent)."""
        mesh = self.get(name)
        return 0 if mesh is None else mesh.get_local_rank()

    def size(self, name: str) -> int:
        mesh = self.get(name)
        return 1 if mesh is None else mesh.size()

    def __str__(self) -> str:
        return f"Meshes({self.root}, views={list(self.views)})"
