"""parallel/expert_dispatch.py: one row per (token, rank), the received rows grouped by local
expert with the other ranks' slots on one zero row, and exact, deterministic backwards."""

from __future__ import annotations

import torch

from kenotron.models.common.experts import gather_rows, sum_rows
from kenotron.parallel.expert_dispatch import (
    CombineRows,
    SelectRows,
    destinations,
    padded_rows,
    pair_counts,
    received_grouping,
    send_order,
)


def test_each_token_goes_once_to_each_rank_holding_one_of_its_experts():
    ids = torch.tensor([[0, 1], [0, 3], [2, 3]])  # 4 experts over 2 ranks: rank 0 has 0-1, rank 1 has 2-3
    present = destinations(ids, ep=2, local=2)
    assert present.tolist() == [[True, False], [True, True], [False, True]]
    pairs = send_order(present)[: int(present.sum())]
    tokens, ranks = (pairs % 3).tolist(), (pairs // 3).tolist()
    assert list(zip(ranks, tokens)) == [(0, 0), (0, 1), (1, 1), (1, 2)]  # by rank, then token


def test_select_then_combine_round_trips_values_and_gradients():
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    token, rank = torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 1, 1])
    slot = token * 2 + rank
    rows = SelectRows.apply(x, token, slot, 2)
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).unsqueeze(1)
    out = CombineRows.apply(rows * scale, token, slot, 3, 2)
    expected = torch.stack([x[0], 5 * x[1], 4 * x[2]])
    torch.testing.assert_close(out, expected)
    assert torch.autograd.gradcheck(lambda v: CombineRows.apply(SelectRows.apply(v, token, slot, 2) * scale, token,
                                                                slot, 3, 2), (x,))


def test_received_grouping_computes_only_local_pairs_and_zeroes_the_others():
    # 3 received rows, top-2; local experts 0..1, id 2 = an expert of another rank.
    local_ids = torch.tensor([[0, 2], [1, 0], [2, 1]])
    align = 4
    real_rows = int(padded_rows(torch.tensor([2, 2]), align))
    g = received_grouping(local_ids, torch.tensor([2, 2]), k=2, align=align, real_rows=real_rows)
    assert g.rows == real_rows + 1 == 9 and g.offsets.tolist() == [4, 9] and g.counts.tolist() == [2, 2]
    x = torch.arange(1.0, 4.0).unsqueeze(1)  # row r holds r + 1
    grouped = gather_rows(x, g)
    assert grouped[-1].item() == 0.0  # the shared zero row
    # Summing back each row's slots: the other rank's slots add the zero row.
    assert sum_rows(grouped, g).squeeze(1).tolist() == [1.0, 4.0, 3.0]


def test_pair_counts_count_each_experts_pairs():
    ids = torch.tensor([[0, 3], [3, 1], [3, 0]])
    assert pair_counts(ids, 5).tolist() == [2, 1, 0, 3, 0]
