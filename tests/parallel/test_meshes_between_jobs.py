"""A job's meshes built after another job's in the same process (a notebook, the test pool):
DeviceMesh equality ignores process groups, so DTensor's caches would hand the new job's
parameters the old job's mesh, whose groups the old job destroyed (build_device_meshes forgets
the caches first: kenotron/dtensor.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d as c10d
from torch.distributed.tensor import Shard, distribute_tensor

from kenotron.degrees import ParallelDims
from kenotron.parallel.dims import build_device_meshes
from tests.distributed.pool import run_on_ranks


def _two_jobs_expert_weights() -> list[bool]:
    """Two jobs in one call, each making an expert weight over its ep mesh as parallel/expert.py
    does, the first ending with its groups destroyed; whether each weight sits on its job's mesh
    and reduces over its groups."""
    on_own_mesh = []
    for _ in range(2):
        meshes = build_device_meshes(ParallelDims.from_degrees(2, ep=2), "cpu")
        ep = meshes.get("ep")
        weight = nn.Parameter(distribute_tensor(torch.empty(4, 3, device="meta"), ep, [Shard(0)], src_data_rank=None))
        on_own_mesh.append(weight.device_mesh is ep)
        total = torch.ones(1)
        dist.all_reduce(total, group=weight.device_mesh.get_group())  # gradient clipping's reduction
        assert total.item() == 2
        dist.barrier()
        for group in [g for g in list(c10d._world.pg_map) if g is not c10d.GroupMember.WORLD]:
            dist.destroy_process_group(group)
    return on_own_mesh


def test_a_second_job_puts_its_expert_weights_on_its_own_mesh_not_the_first_jobs():
    for on_own_mesh in run_on_ranks(2, _two_jobs_expert_weights):
        assert on_own_mesh == [True, True]
