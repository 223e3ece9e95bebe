"""Weights tied across pipeline stages (an embedding shared with the output projection).

In the whole model the embedding and the output projection are one tensor. Cut into stages,
the first stage holds it as `tok_embeddings.weight` and the last as `output.weight`: two
copies. They stay bit-identical if they start equal (the first stage's copy is sent to the
others after init), get the same gradient (the copies' gradients are summed, which is the
gradient of the shared tensor) and take the same optimizer step (same hyper-parameters, and
the clipping factor is global). The gradient norm counts one copy only.

Under V schedules both copies live on rank 0's two stages and are summed locally; otherwise
one small process group per (dp, tp) position joins the ranks that hold a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from kenotron.dtensor import local_tensor
from kenotron.parallel.dims import Meshes
from kenotron.parallel.pipeline import PipelineSplit


@dataclass
class TiedCopies:
    """This rank's copies of one tied tensor and how to reach the other holders."""

    names: list[str]
    """Parameter FQNs of the tied group (the first is the copy that counts in the norm)."""
    local: list[nn.Parameter]
    """The copies held by this rank's stages, in the order of `names`."""
    counted: bool
    """Whether this rank holds the first name's copy (the one counted in the gradient norm)."""
    group: dist.ProcessGroup | None
    """Ranks holding a copy at this (dp, tp) position when they are several; None if only this rank."""
    source: int
    """Global rank that holds the first name's copy (source of the initial weights)."""


def _column_ranks(meshes: Meshes, pp_ranks: list[int]) -> tuple[list[list[int]], int]:
    """For every position along the non-pp dimensions, the global ranks at `pp_ranks`; and the
    index of this rank's position."""
    root = meshes.root
    assert root is not None
    grid = root.mesh.reshape(root.mesh.shape[0], -1)  # pp is the outermost dimension
    columns = [[int(grid[p, j]) for p in pp_ranks] for j in range(grid.shape[1])]
    me = dist.get_rank()
    mine = next(j for j, column in enumerate(columns) if me in grid[:, j].tolist())
    return columns, mine


class TiedAcrossStages:
    """All tied groups of a pipeline split, as seen from this rank. Every rank builds it (the
    process groups are created collectively), also ranks that hold no copy."""

    def __init__(self, split: PipelineSplit, parts: list[nn.Module], meshes: Meshes) -> None:
        self.groups: list[TiedCopies] = []
        params = {name: p for part in parts for name, p in part.named_parameters()}
        for names in split.tied_parameters:
            owners = sorted({split.rank_of_stage(split.stage_of(n)) for n in names})  # type: ignore[arg-type]
            first_owner = split.rank_of_stage(split.stage_of(names[0]))  # type: ignore[arg-type]
            columns, mine = _column_ranks(meshes, owners)
            group = None
            if len(owners) > 1:
                for j, ranks in enumerate(columns):  # collective: every rank creates every group
                    made = dist.new_group(ranks)
                    if j == mine and dist.get_rank() in ranks:
                        group = made
            source = _column_ranks(meshes, [first_owner])[0][mine][0]
            local = [params[n] for n in names if n in params]
            if local:
                self.groups.append(TiedCopies(list(names), local, names[0] in params, group, source))

    @torch.no_grad()
    def sync_weights_(self) -> None:
        """Make every copy equal to the first name's (call once after init or loading)."""
        for tied in self.groups:
            first = local_tensor(tied.local[0])
            if tied.group is not None:
                dist.broadcast(first, src=tied.source, group=tied.group)
            for other in tied.local[1:]:
                local_tensor(other).copy_(first)

    @torch.no_grad()
    def sum_gradients_(self) -> None:
        """Give every copy the sum of the copies' gradients: the gradient of the shared tensor."""
        for tied in self.groups:
            grads = [local_tensor(p.grad) for p in tied.local if p.grad is not None]
            if len(grads) != len(tied.local):
                raise RuntimeError(f"tied parameters {tied.names}: a local copy has no gradient after backward")
            total = grads[0]
            for g in grads[1:]:
                total.add_(g)
            if tied.group is not None:
                dist.all_reduce(total, group=tied.group)
            for g in grads[1:]:
                g.copy_(total)

    def norm_duplicates(self) -> set[int]:
        """ids of the local copies that must not count in the gradient norm (all but one)."""
        skip: set[int] = set()
        for tied in self.groups:
            keep = tied.local[0] if tied.counted else None
            skip.update(id(p) for p in tied.local if p is not keep)
        return skip
