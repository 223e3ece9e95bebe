"""Ring attention: exact causal attention over a sequence sharded across the cp ranks.

Each rank keeps its queries; the key/value blocks of every rank pass by (rotation), and each
query chunk attends to the key chunks it may see under the causal mask, in *global* positions
(`SequenceLayout`), so the head-tail load-balanced layout and the contiguous one both work.
Partial results are merged through their log-sum-exp in fp32 (block_math.py). Backward
recomputes the probabilities from the saved log-sum-exp and sends each key/value block's
gradient back to the rank that owns it.

With document masking (`documents`: the document ids of the whole sequence, documents.py) each
chunk pair applies its slice of the block-causal mask in global positions, and pairs the mask
empties are skipped in forward and backward alike.

Two ways to move the key/value blocks (`rotate_method`, the names torch's context parallel
uses):
- "allgather": one all-gather of every rank's keys/values (overlapped with the local block);
  backward returns the key/value gradients with one all-to-all. cp times the key/value memory
  for the duration of one layer's attention, two collectives per layer.
- "alltoall": a ring of point-to-point sends to the next rank, each overlapped with the
  compute on the current block; backward passes the key/value gradients along with them.
  Memory of one extra block, 2*(cp-1) (forward) and 3*cp-2 (backward) messages per layer.

This is kenotron's CPU/gloo implementation (torch's own context parallel has no CPU kernel) and
the fallback on CUDA; the math runs in fp32 with explicit scores per chunk pair, so it is
exact but not fast. On CUDA the default is torch's ring over the fused kernels (torch_ring.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from kenotron.parallel.collectives import all_gather_single
from kenotron.parallel.context.block_math import (
    group_heads,
    merge_partial,
    pair_backward,
    pair_forward,
    ungroup_heads,
)
from kenotron.parallel.context.documents import SequenceDocuments, check_documents, chunk_ids, pair_mask
from kenotron.parallel.context.layout import SequenceLayout

ROTATE_METHODS = ("allgather", "alltoall")
# Distinct tags keep the key/value stream and the gradient stream apart on gloo.
_KV_TAG, _GRAD_TAG = 11, 12


class _Ring:
    """This rank's place in the cp group and its neighbours (global ranks, for send/recv)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, send: torch.Tensor, tag: int) -> tuple[torch.Tensor, list[dist.Work]]:
        """Start sending `send` to the next rank and receiving the previous rank's buffer."""
        recv = torch.empty_like(send)
        works = [
            dist.isend(send, self.next, group=self.group, tag=tag),
            dist.irecv(recv, self.prev, group=self.group, tag=tag),
        ]
        return recv, works


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


def _pack(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unpack(buffer: torch.Tensor, *shapes: torch.Size) -> list[torch.Tensor]:
    out, offset = [], 0
    for shape in shapes:
        n = shape.numel()
        out.append(buffer[offset : offset + n].view(shape))
        offset += n
    return out


def _kv_blocks(
    k: torch.Tensor, v: torch.Tensor, ring: _Ring, method: str
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(source rank, keys, values) of every rank's block, this rank's own first; the transfer of
    the next block is in flight while the caller computes on the current one."""
    if ring.size == 1:
        yield ring.rank, k, v
        return
    packed = _pack(k, v)
    if method == "allgather":
        gathered = packed.new_empty(ring.size * packed.numel())
        work = all_gather_single(gathered, packed, group=ring.group, async_op=True)
        yield ring.rank, k, v
        work.wait()
        blocks = gathered.chunk(ring.size)
        for i in range(1, ring.size):
            src = (ring.rank - i) % ring.size
            kb, vb = _unpack(blocks[src], k.shape, v.shape)
            yield src, kb, vb
        return
    recv, works = ring.shift(packed, _KV_TAG)
    yield ring.rank, k, v
    for i in range(1, ring.size):
        _wait(works)
        packed = recv
        if i < ring.size - 1:
            recv, works = ring.shift(packed, _KV_TAG)
        kb, vb = _unpack(packed, k.shape, v.shape)
        yield (ring.rank - i) % ring.size, kb, vb


def _visible(layout: SequenceLayout, q_chunk: int, src: int) -> tuple[list[int], int | None]:
    """Which of rank `src`'s chunks the query chunk sees: indices wholly before it (all keys
    visible) and the index of the same chunk (causal triangle), if `src` holds it."""
    before, same = [], None
    for i, chunk in enumerate(layout.chunks_of(src)):
        if chunk < q_chunk:
            before.append(i)
        elif chunk == q_chunk:
            same = i
    return before, same


Pair = tuple[list[int], bool, torch.Tensor | None]
"""(indices of the source block's chunks, causal triangle?, document mask or None) of one pair."""


def _pairs(layout: SequenceLayout, q_chunk: int, src: int, documents: torch.Tensor | None) -> list[Pair]:
    """The pairs a query chunk computes against rank `src`'s block: its earlier chunks together,
    then its own chunk. With document ids (of the whole sequence) each carries its slice of the
    block-causal mask, and a pair the mask empties is left out (documents.py)."""
    before, same = _visible(layout, q_chunk, src)
    pairs: list[Pair] = [(before, False, None)] if before else []
    if same is not None:
        pairs.append(([same], True, None))
    if documents is None:
        return pairs
    src_chunks = layout.chunks_of(src)
    q_ids = chunk_ids(documents, layout, [q_chunk])
    masked: list[Pair] = []
    for indices, causal in ((i, c) for i, c, _ in pairs):
        mask = pair_mask(q_ids, chunk_ids(documents, layout, [src_chunks[i] for i in indices]), causal)
        if mask is not False:
            masked.append((indices, causal, mask))  # type: ignore[arg-type]
    return masked


def _select(parts: tuple[torch.Tensor, ...], whole: torch.Tensor, indices: list[int]) -> torch.Tensor:
    """The chunks `indices` of a block, without a copy when that is the whole block."""
    if len(indices) == len(parts):
        return whole
    return parts[indices[0]] if len(indices) == 1 else torch.cat([parts[i] for i in indices], dim=3)


def _ring_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: _Ring, layout: SequenceLayout, method: str, scale: float,
    documents: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped fp32 output (batch, kv_heads, group, local_len, dim) and its log-sum-exp."""
    kv_heads, c = k.shape[1], layout.chunk_len
    q_chunks = layout.chunks_of(ring.rank)
    q_parts = group_heads(q, kv_heads).split(c, dim=3)
    outs: list[torch.Tensor | None] = [None] * len(q_chunks)
    lses: list[torch.Tensor | None] = [None] * len(q_chunks)
    for src, kb, vb in _kv_blocks(k, v, ring, method):
        kg, vg = kb.float().unsqueeze(2), vb.float().unsqueeze(2)
        k_parts, v_parts = kg.split(c, dim=3), vg.split(c, dim=3)
        for qi, q_chunk in enumerate(q_chunks):
            for indices, causal, mask in _pairs(layout, q_chunk, src, documents):
                o, lse = pair_forward(
                    q_parts[qi], _select(k_parts, kg, indices), _select(v_parts, vg, indices), causal, scale, mask
                )
                outs[qi], lses[qi] = merge_partial(outs[qi], lses[qi], o, lse)
    # Every query chunk met its own chunk (the diagonal) in this rank's own block.
    return torch.cat(outs, dim=3), torch.cat(lses, dim=3)  # type: ignore[arg-type]


def _block_grads(
    src: int, kb: torch.Tensor, vb: torch.Tensor, q_parts: tuple[torch.Tensor, ...], go_parts: tuple[torch.Tensor, ...],
    lse_parts: tuple[torch.Tensor, ...], delta_parts: tuple[torch.Tensor, ...], grad_q_parts: list[torch.Tensor],
    q_chunks: tuple[int, ...], layout: SequenceLayout, scale: float, documents: torch.Tensor | None,
) -> torch.Tensor:
    """Add this block's share to the query gradients; return its key/value gradients, packed (fp32)."""
    c = layout.chunk_len
    kg, vg = kb.float().unsqueeze(2), vb.float().unsqueeze(2)
    k_parts, v_parts = kg.split(c, dim=3), vg.split(c, dim=3)
    grad_k, grad_v = torch.zeros_like(kg), torch.zeros_like(vg)
    gk_parts, gv_parts = grad_k.split(c, dim=3), grad_v.split(c, dim=3)
    for qi, q_chunk in enumerate(q_chunks):
        for indices, causal, mask in _pairs(layout, q_chunk, src, documents):
            gq, gk, gv = pair_backward(
                q_parts[qi], _select(k_parts, kg, indices), _select(v_parts, vg, indices), go_parts[qi],
                lse_parts[qi], delta_parts[qi], causal, scale, mask,
            )
            grad_q_parts[qi] += gq
            for j, i in enumerate(indices):
                gk_parts[i].add_(gk.narrow(3, j * c, c))
                gv_parts[i].add_(gv.narrow(3, j * c, c))
    return _pack(grad_k.squeeze(2), grad_v.squeeze(2))


def _ring_backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    ring: _Ring, layout: SequenceLayout, method: str, scale: float, documents: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_heads, c = k.shape[1], layout.chunk_len
    q_chunks = layout.chunks_of(ring.rank)
    qg, go = group_heads(q, kv_heads), group_heads(grad_out, kv_heads)
    delta = (go * group_heads(out, kv_heads)).sum(dim=-1)
    q_parts, go_parts = qg.split(c, dim=3), go.split(c, dim=3)
    lse_parts, delta_parts = lse.split(c, dim=3), delta.split(c, dim=3)
    grad_q = torch.zeros_like(qg)
    grad_q_parts = list(grad_q.split(c, dim=3))
    args = (q_parts, go_parts, lse_parts, delta_parts, grad_q_parts, q_chunks, layout, scale, documents)
    blocks = _kv_blocks(k, v, ring, method)

    if ring.size == 1:
        own = _block_grads(*next(blocks), *args)
    elif method == "allgather":
        # Gradients for every rank's block, then one all-to-all hands each its share to sum.
        per_block = torch.empty(ring.size, 2 * k.numel(), dtype=torch.float32, device=k.device)
        for src, kb, vb in blocks:
            per_block[src] = _block_grads(src, kb, vb, *args)
        received = torch.empty_like(per_block)
        dist.all_to_all_single(received, per_block, group=ring.group)
        own = received.sum(dim=0)
    else:
        # The gradient of a block travels the ring behind the block itself: a rank adds its
        # share and passes it on; after a full turn it reaches the block's owner.
        incoming, works = None, []
        for i, (src, kb, vb) in enumerate(blocks):
            grads = _block_grads(src, kb, vb, *args)
            if i > 0:
                _wait(works)
                grads = grads + incoming
            incoming, works = ring.shift(grads, _GRAD_TAG)
        _wait(works)
        own = incoming
    grad_k, grad_v = _unpack(own, k.shape, v.shape)
    return ungroup_heads(grad_q).to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


class _RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: _Ring, layout: SequenceLayout, method: str, scale: float,  # type: ignore[override]
                documents: torch.Tensor | None):
        out_grouped, lse = _ring_forward(q, k, v, ring, layout, method, scale, documents)
        out = ungroup_heads(out_grouped).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.layout, ctx.method, ctx.scale, ctx.documents = ring, layout, method, scale, documents
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        grads = _ring_backward(grad_out, q, k, v, out, lse, ctx.ring, ctx.layout, ctx.method, ctx.scale,
                               ctx.documents)
        return (*grads, None, None, None, None, None)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    load_balance: bool = True,
    rotate_method: str = "allgather",
    scale: float | None = None,
    documents: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sharded sequence; with `documents`
    (batch, local_len * cp), the document ids of the whole sequence, block-causal attention.

    q (batch, heads, local_len, dim), k/v (batch, kv_heads, local_len, dim) hold this rank's
    tokens in the layout `SequenceLayout(local_len * cp, cp, load_balance)` describes; heads
    must be a multiple of kv_heads. Returns (batch, heads, local_len, dim) in q's dtype.
    """
    if rotate_method not in ROTATE_METHODS:
        raise ValueError(f"rotate_method={rotate_method!r} is not one of {', '.join(ROTATE_METHODS)}")
    if q.shape[1] % k.shape[1] != 0 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"ring attention needs q (b, h, s, d) and k = v (b, h_kv, s, d) with h a multiple of h_kv; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    ring = _Ring(group)
    layout = SequenceLayout(q.shape[2] * ring.size, ring.size, load_balance)
    if documents is not None and documents.shape != (q.shape[0], layout.seq_len):
        raise ValueError(f"documents of shape {tuple(documents.shape)} are not the whole sequence's ids "
                         f"({q.shape[0]}, {layout.seq_len}) for q of shape {tuple(q.shape)} on {ring.size} ranks")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _RingAttentionFunction.apply(q, k, v, ring, layout, rotate_method, scale, documents)


class RingAttention(nn.Module):
    """Drop-in `attention_fn` of an attention module under context parallel (no parameters)."""

    takes_documents = True
    """The model's attention may hand it the batch's SequenceDocuments (models/common/attention.py)."""

    def __init__(self, group: dist.ProcessGroup, load_balance: bool = True, rotate_method: str = "allgather") -> None:
        super().__init__()
        if rotate_method not in ROTATE_METHODS:
            raise ValueError(f"rotate_method={rotate_method!r} is not one of {', '.join(ROTATE_METHODS)}")
        self.group = group
        self.load_balance = load_balance
        self.rotate_method = rotate_method

    # Dynamo cannot trace the point-to-point sends inside: a compiled block runs this part eagerly
    # (the plan compiles blocks without fullgraph when ring attention is in them).
    @torch.compiler.disable
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                documents: SequenceDocuments | None = None) -> torch.Tensor:
        """`documents`: the whole sequence's document ids (document masking), or None (causal)."""
        documents = check_documents(documents)
        return ring_attention(q, k, v, self.group, load_balance=self.load_balance, rotate_method=self.rotate_method,
                              documents=None if documents is None else documents.ids)

    def extra_repr(self) -> str:
        return f"cp={dist.get_world_size(self.group)}, load_balance={self.load_balance}, rotate={self.rotate_method}"
