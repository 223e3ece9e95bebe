"""On a real 2-rank gloo group: each rank's slice of the global batch, gathered, is the 1-rank batch."""

from __future__ import annotations

import torch
import torch.distributed as dist

from kenotron.data import build_text_loader, build_tokenizer
from tests.distributed.pool import run_on_ranks

SEQ, GLOBAL = 32, 8


def _loader(dp_rank: int, dp_size: int, local: int):
    return build_text_loader(build_tokenizer(""), "builtin", "", SEQ, GLOBAL, local, dp_rank=dp_rank, dp_size=dp_size)


def _gathered_global_batches(steps: int, local: int) -> list[torch.Tensor]:
    loader = _loader(dist.get_rank(), dist.get_world_size(), local)
    out = []
    for _ in range(steps):
        mine = torch.cat([mb.inputs for mb in loader.next_step()])
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, mine)
        out.append(torch.cat(parts))
    return out


def test_dp_slices_on_two_ranks_are_disjoint_and_together_equal_the_one_rank_batch():
    reference = _loader(0, 1, GLOBAL)
    expected = [reference.next_step()[0].inputs for _ in range(3)]
    for local in (1, 2, 4):  # 4, 2 and 1 micro-steps per rank
        per_rank = run_on_ranks(2, _gathered_global_batches, 3, local)
        for rank_view in per_rank:
            for step, batch in enumerate(rank_view):
                torch.testing.assert_close(batch, expected[step], rtol=0, atol=0)
    # Rank 0's half and rank 1's half are different sequences.
    assert not torch.equal(expected[0][: GLOBAL // 2], expected[0][GLOBAL // 2 :])
