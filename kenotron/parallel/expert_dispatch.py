"""Expert parallel's token exchange: each token travels once to each rank that holds one of its
experts, not once per expert.

With top-k routing over ep ranks, a token's k experts often share a rank (top-8 of 128 experts
over 2 ranks: about 4 per rank), so sending one row per (token, expert) moves k rows where
sending one per (token, rank) moves at most min(k, ep). A sent row carries, beside the token,
which of its experts live on the receiving rank (their local ids; `local` marks the others) and
their routing weights (0 for the others). The receiver runs each row through those experts,
weights and sums their outputs, and sends one row back per row received; the sender adds the
rows of each token (one per rank). What it saves on GPUs: docs/performance.md, weak scaling.

Both directions move rows with deterministic backwards (no scatter-add atomics): a token's sent
rows are told apart by their slot, token * ep + rank, which is unique.
"""

from __future__ import annotations

import torch

from kenotron.models.common.experts import Grouping, group_by_expert, padded_counts


class SelectRows(torch.autograd.Function):
    """rows[i] = x[token[i]]; backward adds each token's rows, each written to its unique slot
    (token * slots_per_token + rank) and summed over the slots."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor, slots_per_token: int) -> torch.Tensor:
        ctx.save_for_backward(slot)
        ctx.tokens, ctx.slots = x.shape[0], slots_per_token
        return x.index_select(0, token)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (slot,) = ctx.saved_tensors
        return combine_slots(grad, slot, ctx.tokens, ctx.slots), None, None, None


class CombineRows(torch.autograd.Function):
    """out[t] = sum of the rows whose token is t (at most one per slot); backward selects."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, token: torch.Tensor, slot: torch.Tensor, tokens: int,
                slots_per_token: int) -> torch.Tensor:
        ctx.save_for_backward(token)
        return combine_slots(rows, slot, tokens, slots_per_token)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (token,) = ctx.saved_tensors
        return grad.index_select(0, token), None, None, None, None


def combine_slots(rows: torch.Tensor, slot: torch.Tensor, tokens: int, slots_per_token: int) -> torch.Tensor:
    """Each token's sum of `rows`, row i written to slot[i] (token * slots_per_token + rank)."""
    buffer = rows.new_zeros((tokens * slots_per_token, *rows.shape[1:]))
    buffer.index_copy_(0, slot, rows)
    return buffer.view(tokens, slots_per_token, *rows.shape[1:]).sum(1)


def destinations(expert_ids: torch.Tensor, ep: int, local: int) -> torch.Tensor:
    """(tokens, ep) bool: which ranks hold at least one of each token's experts."""
    present = torch.zeros(expert_ids.shape[0], ep, dtype=torch.bool, device=expert_ids.device)
    return present.scatter_(1, torch.div(expert_ids, local, rounding_mode="floor"), True)


def pair_counts(expert_ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(n_experts,) int64: how many (token, expert) pairs each expert has. Compared against every
    expert id rather than `torch.bincount`, which reads the largest id on the host (a
    synchronization), or an accumulating index_put, which adds long runs of equal ids serially."""
    experts = torch.arange(n_experts, device=expert_ids.device)
    return (expert_ids.reshape(-1, 1) == experts).sum(0)


def send_order(present: torch.Tensor) -> torch.Tensor:
    """(rank * tokens + token) of every (token, rank) to send, ordered by rank then token, first;
    the pairs not sent follow (the caller keeps the first sum(present) entries)."""
    return torch.argsort((~present).t().reshape(-1).to(torch.int8), stable=True)


def padded_rows(pairs_per_expert: torch.Tensor, align: int) -> torch.Tensor:
    """Rows of the experts' grouped buffer before its last group's tail: each expert's pairs padded
    as group_by_expert pads them (0-d tensor); `received_grouping` cuts the buffer there."""
    return padded_counts(pairs_per_expert, align).sum()


def received_grouping(local_ids: torch.Tensor, pairs: torch.Tensor, k: int, align: int, real_rows: int) -> Grouping:
    """Group the received (row, slot) pairs by local expert (`pairs`: how many each has); the
    slots whose expert lives elsewhere (id `local`) all point at one zero row appended to the last
    expert's group (its output is 0: the experts have no bias), so no buffer row is spent on them."""
    local = pairs.shape[0]
    flat = local_ids.reshape(-1)
    counts = torch.cat([pairs, (flat.shape[0] - pairs.sum()).view(1)])
    g = group_by_expert(flat, local + 1, k, align, counts)
    src_copy = torch.cat([g.src_copy[:real_rows], g.src_copy.new_full((1,), g.copies)])
    dest_row = torch.where(g.dest_row < real_rows, g.dest_row, real_rows)
    offsets = g.offsets[:local].clone()
    offsets[-1] = real_rows + 1
    return Grouping(src_copy, dest_row, offsets, g.counts[:local], k)
