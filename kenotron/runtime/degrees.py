"""The parallel layout's checks that need only the config and the world size (no torch, no model).

    dims, global_batch, accum = layout_degrees(cfg, world_size)

The launcher runs them first, in about the time Python and the config take to import: degrees
whose product does not divide the world size, batch sizes that do not divide, come back at
once. resolve_run runs them too (runtime/preflight.py's resolve_degrees), as its first step of
the layout.
"""

from __future__ import annotations

from kenotron.config import JobConfig
from kenotron.degrees import ParallelDims


def layout_degrees(cfg: JobConfig, world_size: int) -> tuple[ParallelDims, int, int]:
    """The parallel degrees laid out on `world_size`, the global batch size and the
    gradient-accumulation steps (ParallelConfigError naming the fix)."""
    p, t = cfg.parallelism, cfg.training
    dims = ParallelDims.from_degrees(world_size, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp,
                                     pp=p.pp, ep=p.ep)
    global_batch = t.global_batch_size if t.global_batch_size != -1 else t.local_batch_size * dims.dp
    return dims, global_batch, dims.grad_accum_steps(global_batch, t.local_batch_size)
