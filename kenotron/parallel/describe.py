"""What a plan does to each parameter on a mesh shape, computed without a process group.

The placements follow what `Plan.apply` produces: tensor parallel shards a weight on dim 0
(colwise, embedding, output, a module's own parameters under channels) or dim 1 (rowwise); FSDP then shards dim 0 of that local piece
over dp_shard x cp (and replicates over dp_replicate); DDP and ZeRO-1 replicate parameters.
Under expert parallelism an expert weight is sharded over ep on dim 0 (the experts), then
FSDP-sharded over the dp_shard x cp / ep ranks ep leaves (shown as S(0) in dp_shard: "efsdp"; where
those are one rank without dp_replicate or pp the experts stay outside FSDP, each ep rank holding its own whole);
every other parameter treats the ep ranks as data-parallel ones ("(dp)" in the ep column).
Local shapes use torch.chunk's rule (the first ranks hold ceil(n / k) rows), so they are
those of rank 0, the largest.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from kenotron.parallel.model_layout import ModelLayout, fqn_matches
from kenotron.parallel.parallel_settings import ParallelSettings

MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "ep", "tp")


def _tp_shard_dim(style: str | None, param_name: str) -> int | None:
    """Dimension tensor parallel splits this parameter on, or None if replicated on tp."""
    if style in ("colwise", "embedding", "output", "channels"):
        return 0
    if style == "rowwise":
        return 1 if param_name == "weight" else None
    return None


def describe_parameters(layout: ModelLayout, settings: ParallelSettings, model: nn.Module,
                        mesh_shape: dict[str, int]) -> list[dict[str, Any]]:
    """Per parameter of `model`: what a plan of this layout and these settings makes of it on
    `mesh_shape` (a notebook calls it through `Plan.describe`)."""
    unknown = set(mesh_shape) - set(MESH_DIMS) - {"pp"}
    if unknown:
        raise ValueError(f"mesh_shape has unknown dimensions {sorted(unknown)}; use {MESH_DIMS}")
    deg = {d: int(mesh_shape.get(d, 1)) for d in MESH_DIMS}
    shard_degree = deg["dp_shard"] * deg["cp"]
    experts = layout.experts
    rows = []
    for name, param in model.named_parameters():
        module_fqn, _, pname = name.rpartition(".")
        placements = {d: "R" for d in MESH_DIMS if deg[d] > 1}
        if deg["ep"] > 1:
            placements["ep"] = "(dp)"  # the ep ranks are data-parallel ranks to all but the experts
        local = list(param.shape)
        tp_dim = _tp_shard_dim(layout.style_of(module_fqn), pname) if deg["tp"] > 1 else None
        if tp_dim is not None:
            placements["tp"] = f"S({tp_dim})"
            local[tp_dim] = math.ceil(local[tp_dim] / deg["tp"])
        if experts and deg["ep"] > 1 and fqn_matches(experts, module_fqn):
            placements["ep"] = "S(0)"
            local[0] = math.ceil(local[0] / deg["ep"])
            efsdp = shard_degree // deg["ep"]
            if efsdp > 1:
                placements["dp_shard"] = "S(0)"
                local[0] = math.ceil(local[0] / efsdp)
        elif settings.dp_mode == "fsdp" and shard_degree > 1:
            for d in ("dp_shard", "cp"):
                if deg[d] > 1:
                    placements[d] = "S(0)"
            local[0] = math.ceil(local[0] / shard_degree)
        numel = math.prod(local)
        rows.append(
            {
                "name": name,
                "global_shape": tuple(param.shape),
                "placements": placements,
                "local_shape": tuple(local),
                "bytes": numel * torch.finfo(torch.float32).bits // 8,
            }
        )
    return rows


def format_description(rows: list[dict[str, Any]], mesh_shape: dict[str, int]) -> str:
    dims = [d for d in MESH_DIMS if int(mesh_shape.get(d, 1)) > 1]
    header = ("parameter", "global shape", *dims, "local shape", "MiB/rank")
    table = [header]
    for r in rows:
        table.append(
            (
                r["name"],
                "x".join(map(str, r["global_shape"])),
                *(r["placements"].get(d, "R") for d in dims),
                "x".join(map(str, r["local_shape"])),
                f"{r['bytes'] / 2**20:.3f}",
            )
        )
    width = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, width)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in width))
    total = sum(r["bytes"] for r in rows)
    mesh = " x ".join(f"{d} {mesh_shape[d]}" for d in dims) or "1 rank"
    lines.append(f"total parameters per rank on {mesh}: {total / 2**20:.2f} MiB (fp32)")
    return "\n".join(lines)
