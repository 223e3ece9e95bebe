"""Expert parallel's token exchange without a host read: every rank sends every token to every
rank of its ep group, so every split is even and known before the values exist.

The deduplicated exchange (parallel/expert_dispatch.py) sends each token once to each rank that
holds one of its experts: at most T rows per rank pair for T local tokens. Sending all T rows to
every rank is that bound, exact and with static shapes: a rank's rows are its tokens in order,
each with the token's k expert ids; the receiver computes the slots whose experts it holds and
points the others at one zero row, and sends one row back per row received (0 for a token none of
whose experts it holds); the sender adds its tokens' rows over the ranks. Nothing reads a split
size, an expert's count or a buffer's length on the host, in forward or backward.

What it costs (docs/performance.md, "expert parallel without the host read"):
- bytes: (ep - 1) * T rows per direction where the deduplicated exchange moves (ep - 1) * T *
  fill, fill the chance that a rank holds one of a token's k experts (uniform routing: 1 -
  C(n - n/ep, k) / C(n, k); 0.996 for top-8 of 128 experts over 2 ranks, 0.90 over 4, 0.66 over 8);
- memory: the grouped buffer is planned for the worst case, every received slot on this rank:
  P = ep * T * min(k, local) rows where even routing fills T * k (ep times the deduplicated
  path's buffer; torch._grouped_mm computes only the rows up to the last group's end, and so do
  the row gathers and the gate on CUDA (models/common/grouped_tail.py), so the time is the real
  rows', but the buffer spans the whole of it). For
  backward the first expert GEMM keeps the ep * T received rows, not the P grouped ones: it
  gathers its rows itself and again in backward (experts.py's gather_grouped_mm, one more row
  copy of P * dim), so what stays ep times the deduplicated path's is the gate's P * 3F.
Both grow with ep while the host read's cost (the GPU idle while the host launches the rest of
the layer) does not: `pays_without_host_read` chooses (ep up to MAX_EVEN_SPLIT_EP, at most
MAX_EMPTY_ROWS rows a token sent for nothing).

float8 experts keep the deduplicated exchange: torchao's grouped GEMM has not been run on a buffer
whose rows past the last group are left unwritten (torch._grouped_mm leaves them so).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd

from kenotron.models.common.experts import GroupedExperts, Grouping, copy_weights, padded_counts, sum_rows
from kenotron.models.common.moe import expert_alignment
from kenotron.models.common.router import RouterOutput
from kenotron.parallel.expert_dispatch import pair_counts

MAX_EVEN_SPLIT_EP = 4
"""The largest ep that exchanges by the even split: its buffers grow with ep (module docstring),
and no larger ep has been compared on GPUs (docs/performance.md)."""
MAX_EMPTY_ROWS = 0.4
"""The most rows per local token, per direction, that the even split may send to ranks holding none
of the token's experts: (ep - 1) * (1 - fill), what it moves beyond the deduplicated exchange
(the rows behind the bound: docs/performance.md, "Issues 33 and 36: four GPUs")."""


def rank_fill(n_experts: int, top_k: int, ep: int) -> float:
    """The chance that a given rank's n/ep experts hold at least one of a token's k distinct
    experts, for uniform routing: 1 - C(n - n/ep, k) / C(n, k)."""
    miss = 1.0
    for i in range(top_k):  # C(n - n/ep, k) / C(n, k), as a product
        miss *= max(n_experts - n_experts // ep - i, 0) / (n_experts - i)
    return 1.0 - miss


def empty_rows(n_experts: int, top_k: int, ep: int) -> float:
    """Rows per local token that the even split sends, and gets back, for nothing: one to each
    other rank, of which a fraction 1 - fill holds none of the token's experts."""
    return (ep - 1) * (1.0 - rank_fill(n_experts, top_k, ep))


def pays_without_host_read(n_experts: int, top_k: int, ep: int, float8_experts: bool) -> bool:
    """Whether the even split (no host read) beats the deduplicated exchange: ep at most
    MAX_EVEN_SPLIT_EP, at most MAX_EMPTY_ROWS empty rows a token, and not float8 experts (module
    docstring)."""
    return (not float8_experts and ep <= MAX_EVEN_SPLIT_EP
            and empty_rows(n_experts, top_k, ep) <= MAX_EMPTY_ROWS)


def to_every_rank(x: torch.Tensor, group: dist.ProcessGroup, ep: int) -> torch.Tensor:
    """(T, ...) on each rank -> (ep * T, ...): every rank's rows, rank s's at [s * T, (s + 1) * T).
    Backward returns each rank its rows' gradients and adds them over the ranks (in rank order)."""
    send = x.unsqueeze(0).expand(ep, *x.shape).reshape(ep * x.shape[0], *x.shape[1:])
    if x.requires_grad:
        return all_to_all_single_autograd(send, None, None, group)
    return all_to_all_single(send, None, None, group)


def sum_over_ranks(rows: torch.Tensor, group: dist.ProcessGroup, ep: int) -> torch.Tensor:
    """(ep * T, ...) computed for every rank's rows -> (T, ...): this rank's rows back from every
    rank, added in rank order (the adjoint of `to_every_rank`)."""
    back = all_to_all_single_autograd(rows, None, None, group)
    return back.view(ep, rows.shape[0] // ep, *rows.shape[1:]).sum(0)


def static_rows(received: int, k: int, local: int, align: int) -> int:
    """Rows of the grouped buffer for `received` rows of k slots: every slot that can be local
    (min(k, local) per row), each local expert's padding, and the zero row; a multiple of align."""
    rows = received * min(k, local) + local * (align - 1) + 1
    return -(-rows // align) * align


def even_split_grouping(local_ids: torch.Tensor, local: int, align: int) -> Grouping:
    """Group the received (row, slot) pairs by local expert, in a buffer of static size
    (`static_rows`). `local_ids` (rows, k): each slot's local expert, `local` for the slots of
    other ranks, which all read one zero row placed right after the last expert's padded group
    and counted in that group (its output is 0: the experts have no bias). The rows past it are
    in no group: torch._grouped_mm leaves them unwritten and nothing reads them."""
    received, k = local_ids.shape
    flat = local_ids.reshape(-1)
    copies, device = flat.shape[0], flat.device
    counts = pair_counts(local_ids, local + 1)  # the last: slots of other ranks
    padded = padded_counts(counts[:local], align)
    ends = torch.cumsum(padded, 0)
    zero_row = ends[-1:]
    unpadded_starts = torch.cumsum(counts, 0) - counts
    starts = torch.cat([ends - padded, zero_row])  # the other ranks' slots all "start" at the zero row
    order = torch.argsort(flat, stable=True)  # grouped (unpadded) position -> copy
    sorted_ids = flat[order]
    elsewhere = sorted_ids == local
    position = torch.where(elsewhere, zero_row, torch.arange(copies, device=device) + (starts - unpadded_starts)[sorted_ids])
    dest_row = torch.empty_like(order).scatter_(0, order, position)
    # Every slot of another rank writes `copies` (the zero row's source) at the zero row: equal values.
    source = torch.where(elsewhere, copies, order)
    src_copy = torch.full((static_rows(received, k, local, align),), copies, dtype=torch.int64, device=device)
    src_copy.scatter_(0, position, source)
    offsets = torch.cat([ends[:-1], zero_row + 1]).to(torch.int32)
    return Grouping(src_copy, dest_row, offsets, counts[:local], k, end=offsets[-1:])


class EvenSplitDispatcher:
    """The expert-parallel dispatcher without a host read: every token to every rank of the ep
    group and one row back from each (module docstring). Every rank of the group passes as many
    tokens (the data-parallel ranks' micro-batches share one shape): the splits are equal."""

    def __init__(self, group: dist.ProcessGroup, ep: int) -> None:
        self.group, self.ep = group, ep
        self.rank = dist.get_rank(group)
        """This rank's place in the ep group: it holds experts [rank * local, (rank + 1) * local)."""

    def __call__(self, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts) -> torch.Tensor:
        ep, group = self.ep, self.group
        local = experts.n_experts // ep
        recv_x = to_every_rank(x, group, ep)
        recv_w = to_every_rank(r.weights, group, ep)
        recv_ids = to_every_rank(r.experts, group, ep)
        first = self.rank * local
        here = (recv_ids >= first) & (recv_ids < first + local)
        g = even_split_grouping(torch.where(here, recv_ids - first, local), local, expert_alignment(experts, x))
        y = experts(recv_x, g.offsets, g.counts, copy_weights(recv_w, g), gather=g)
        return sum_over_ranks(sum_rows(y, g), group, ep)
