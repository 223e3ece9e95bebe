"""Weights tied across pipeline stages (an embedding shared with the output projection, or a
unit copied onto another stage: pipeline.py's `copies`, under the original's names).

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


def _local_copies(names: list[str], parts: list[nn.Module], stage_ids: list[int], original: int | None
                  ) -> tuple[list[nn.Parameter], bool]:
    """This rank's distinct tensors of a group (a stage's copy shares the original's name), the
    original stage's first-named one first; and whether that one is here."""
    local: list[nn.Parameter] = []
    counted = False
    for stage, part in zip(stage_ids, parts, strict=True):
        for name, param in part.named_parameters():
            if name in names and all(param is not p for p in local):
                if stage == original and name == names[0]:
                    local.insert(0, param)
                    counted = True
                else:
                    local.append(param)
    return local, counted


class TiedAcrossStages:
    """All tied groups of a pipeline split, as seen from this rank. Every rank builds it (the
    process groups are created collectively), also ranks that hold no copy."""

    def __init__(self, split: PipelineSplit, parts: list[nn.Module], stage_ids: list[int], meshes: Meshes) -> None:
        """`parts`: this rank's stage modules, stages `stage_ids`."""
        self.groups: list[TiedCopies] = []
        for names in split.tied_parameters:
            owners = sorted({split.rank_of_stage(s) for s in split.holders(names)})
            original = split.stage_of(names[0])  # the stage holding the first name as its own unit
            first_owner = split.rank_of_stage(original)  # type: ignore[arg-type]
            columns, mine = _column_ranks(meshes, owners)
            group = None
            if len(owners) > 1:
                for j, ranks in enumerate(columns):  # collective: every rank creates every group
                    made = dist.new_group(ranks)
                    if j == mine and dist.get_rank() in ranks:
                        group = made
            source = _column_ranks(meshes, [first_owner])[0][mine][0]
            local, counted = _local_copies(names, parts, stage_ids, original)
            if local:
                self.groups.append(TiedCopies(list(names), local, counted, group, source))

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
