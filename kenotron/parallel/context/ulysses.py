"""All-to-all context parallel (DeepSpeed-Ulysses): trade the sequence shard for a head shard.

Each cp rank holds `seq/cp` tokens of every head. One all-to-all over the cp group hands rank j
heads `[j*h/cp, (j+1)*h/cp)` of *every* token, so each rank holds the whole sequence for its
share of the heads; the ordinary attention kernel (SDPA's causal, or flex under a whole-sequence
block mask) runs on it unchanged; a second all-to-all gives every rank its own tokens of all
heads back. Backward is the same two all-to-alls in reverse (the all-to-all's gradient is an
all-to-all), through torch's functional collectives, so autograd and torch.compile see them.

Why a second scheme beside the ring (ring.py): the attention kernel is the fused one of an
unsharded run (no chunk-pair loop, no log-sum-exp merge, no per-pair kernel launches), and
the traffic per layer is fixed: q, k, v there and the output back, each `1/cp` of a shard
leaving every rank, which shrinks with cp where the ring's key/value traffic grows. The price:
the degree is capped by the head count (heads/tp must divide by it; beyond it a ring takes
over, below), and nothing overlaps the all-to-alls with compute (docs/parallelism.md compares
the two).

Token order. The sequence arrives in the layout's order (layout.py: under head-tail load
balancing rank r holds chunks r and 2*cp-1-r), so after the all-to-all the tokens sit in rank
order, chunks 0, 2cp-1, 1, 2cp-2, ... This module puts the chunks back in sequence order
before the kernel and returns them to rank order after it (one gather each way, folded into
the copies the all-to-all needs anyway), so causal attention and any block mask built for the
whole sequence are exact.
That makes document masking the ordinary one: given the micro-batch's document ids of the
whole sequence (`UlyssesAttention.takes_documents`), the module builds the one-rank run's
block-causal mask once per micro-batch and runs flex_attention under it.

With a ring (heads that split over only part of cp). parallelism.cp_scheme='ulysses' runs the
all-to-all over the largest divisor u of cp the heads split over (degrees.py's
`ulysses_degree`) and a ring over the other r = cp/u: cp rank j*u + v is rank v of ring rank
j's all-to-all group (Meshes.split_cp: the all-to-all inner, on the nearer ranks, since
nothing overlaps it; the ring's transfers hide under its compute). Nothing in the token layout
changes: under SequenceLayout(seq, cp) the u ranks of group j hold, between them, the pieces
of the ring's local sequence T_j (chunks j and 2r-1-j of 2r) that SequenceLayout(len(T_j), u)
gives them (rank v: pieces v and 2u-1-v of T_j are chunks j*u+v and 2cp-1-(j*u+v) of 2cp).
So this module's all-to-all over the group hands each rank T_j whole, in order, for heads/u
heads: exactly the input of the ring at degree r, which runs unchanged as `inner` (ring.py,
torch_ring.py or flex_gather.py over the ring sub-group, with the document ids of the whole
sequence under document masking), and the second all-to-all returns each rank its tokens.
Trainer, positions, labels and document ids are those of the plain cp layout.

Grouped kv heads. When the rank's kv heads divide by cp they are split like the query heads.
When cp is a multiple of them (e.g. 8 kv heads, tp 2, cp 8: 4 per tp rank) each kv head is
repeated cp/kv times first, so every rank gets the one its query heads use, as DeepSpeed does;
their gradients are summed back by autograd. Other counts are refused (resolve_run says so
before any process group: kenotron/degrees.py's `check_ulysses_heads`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from kenotron.degrees import ulysses_head_problem
from kenotron.models.common.attention import causal_attention
from kenotron.models.common.flex_attention import document_block_mask, flex_attend
from kenotron.parallel.context.layout import SequenceLayout


def kv_repeats(kv_heads: int, cp: int) -> int:
    """How many times each kv head is repeated so that the cp ranks can share them (1: none)."""
    return 1 if kv_heads % cp == 0 else cp // kv_heads


Places = tuple[tuple[int, int], ...]
"""(rank, slot) of every chunk of the sequence, in sequence order (`chunk_places`)."""


@functools.cache
def chunk_places(layout: SequenceLayout) -> Places:
    """For each chunk of the sequence, in sequence order: the cp rank that holds it and its slot
    among that rank's chunks (the layout's order). Under head-tail balancing chunk c sits on
    rank min(c, 2cp-1-c), slot 0 for a head chunk and 1 for a tail. Plain ints, not index
    tensors: nothing to copy to the device in every layer, nothing a fake-tensor estimate
    could leave in a cache."""
    places = [(0, 0)] * layout.n_chunks
    for rank in range(layout.cp):
        for slot, chunk in enumerate(layout.chunks_of(rank)):
            places[chunk] = (rank, slot)
    return tuple(places)


def _by_rank(buffer: torch.Tensor, per_rank: int) -> torch.Tensor:
    """A view (batch, heads, cp, per_rank, chunk, dim) of an all-to-all buffer (cp, batch, heads, s_local, dim)."""
    cp, b, h, s, d = buffer.shape
    return buffer.view(cp, b, h, per_rank, s // per_rank, d).permute(1, 2, 0, 3, 4, 5)


def _to_sequence(buffer: torch.Tensor, places: Places) -> torch.Tensor:
    """(cp, batch, heads, s_local, dim) in rank order -> (batch, heads, seq, dim) in sequence order: one copy."""
    by_rank = _by_rank(buffer, len(places) // buffer.shape[0])
    return torch.cat([by_rank[:, :, rank, slot] for rank, slot in places], dim=2)


def _to_ranks(x: torch.Tensor, places: Places, cp: int) -> torch.Tensor:
    """The inverse of _to_sequence: (batch, heads, seq, dim) -> a new (cp, batch, heads, s_local, dim)."""
    b, h, seq, d = x.shape
    buffer = x.new_empty(cp, b, h, seq // cp, d)
    by_rank = _by_rank(buffer, len(places) // cp)
    for chunk, (rank, slot) in zip(x.chunk(len(places), dim=2), places):
        by_rank[:, :, rank, slot].copy_(chunk)
    return buffer


class _ToSequence(torch.autograd.Function):
    """_to_sequence whose backward is its inverse (autograd's own would give each chunk's view a
    zeroed tensor of the whole buffer's size and add them up)."""

    @staticmethod
    def forward(ctx, buffer, places):  # type: ignore[override]
        ctx.places, ctx.cp = places, buffer.shape[0]
        return _to_sequence(buffer, places)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _to_ranks(grad, ctx.places, ctx.cp), None


class _ToRanks(torch.autograd.Function):
    """_to_ranks, backward by _to_sequence."""

    @staticmethod
    def forward(ctx, x, places, cp):  # type: ignore[override]
        ctx.places = places
        return _to_ranks(x, places, cp)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _to_sequence(grad.contiguous(), ctx.places), None, None


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Block i of dim 0 goes to rank i; block i of the result came from rank i (differentiable)."""
    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x.contiguous(), None, None, group))


def _scatter_heads(
    tensors: list[torch.Tensor], cp: int, group: dist.ProcessGroup, places: Places
) -> list[torch.Tensor]:
    """[(batch, h_i, s_local, d)] on every rank -> [(batch, h_i/cp, seq, d)] in sequence order.

    Tensors of one head size travel in one all-to-all (one message per rank pair, not three)."""
    b, _, s, d = tensors[0].shape
    # (cp, batch, h_i/cp, s, d) views: block j holds the heads rank j will own; cat makes the one copy.
    parts = [t.reshape(b, cp, t.shape[1] // cp, s, t.shape[-1]).transpose(0, 1) for t in tensors]
    widths = [p.shape[2] for p in parts]
    if all(t.shape[-1] == d for t in tensors):
        received = _all_to_all(torch.cat(parts, dim=2), group).split(widths, dim=2)
    else:
        received = [_all_to_all(p, group) for p in parts]
    # received[i] holds rank i's tokens: chunks back in sequence order in one copy per tensor.
    return [_ToSequence.apply(r, places) for r in received]


def _gather_heads(
    x: torch.Tensor, cp: int, group: dist.ProcessGroup, places: Places
) -> torch.Tensor:
    """(batch, h/cp, seq, d) in sequence order -> (batch, h, s_local, d): the inverse."""
    b, h, seq, d = x.shape
    received = _all_to_all(_ToRanks.apply(x, places, cp), group)
    # received[j] holds this rank's tokens of rank j's heads (cp, b, h, s, d). Laid out as
    # (b, s, cp*h, d), the attention's transpose back to (b, s, heads*d) is free.
    return received.permute(1, 3, 0, 2, 4).reshape(b, seq // cp, cp * h, d).transpose(1, 2)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    load_balance: bool = True,
    block_mask: BlockMask | None = None,
    inner: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_attention,
) -> torch.Tensor:
    """Causal attention of this rank's tokens over the whole sequence sharded on the cp group.

    q (batch, heads, local_len, dim), k/v (batch, kv_heads, local_len, dim) hold this rank's
    tokens in the layout `SequenceLayout(local_len * cp, cp, load_balance)` describes.
    `block_mask`: a FlexAttention mask of the *whole* sequence in sequence order (document
    masking); None: plain causal SDPA. Returns (batch, heads, local_len, dim).
    `inner`: the ring attention over the ring sub-group when `group` is one all-to-all group of
    a larger cp (module docstring): it gets the group's sequence, which is its ring rank's
    local sequence, and replaces the kernel (the block mask then travels with it, not here).
    `kernel`: the plain causal kernel on the whole sequence of this rank's heads (SDPA, or the
    FlashAttention the attention module ran before context parallel replaced it).
    """
    cp = dist.get_world_size(group)
    heads, kv_heads = q.shape[1], k.shape[1]
    problem = ulysses_head_problem(heads, kv_heads, cp)
    if problem or k.shape[:3] != v.shape[:3] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"ulysses attention needs q (b, h, s, d) and k, v (b, h_kv, s, d) whose heads split over cp={cp}; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}{': ' + problem if problem else ''}; "
            f"a plan built by hand sets plan.settings.cp_ulysses_degree (degrees.ulysses_degree) for a ring over the rest"
        )
    if cp == 1 and inner is not None:  # nothing to exchange: the ring alone
        return inner(q, k, v)
    if cp == 1:
        return flex_attend(q, k, v, block_mask) if block_mask is not None else kernel(q, k, v)
    repeats = kv_repeats(kv_heads, cp)
    if repeats > 1:
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    places = chunk_places(SequenceLayout(q.shape[2] * cp, cp, load_balance))
    q_all, k_all, v_all = _scatter_heads([q, k, v], cp, group, places)
    if inner is not None:
        out = inner(q_all, k_all, v_all)
    elif block_mask is not None:
        out = flex_attend(q_all, k_all, v_all, block_mask)
    else:
        out = kernel(q_all, k_all, v_all)
    return _gather_heads(out, cp, group, places)


def whole_sequence_mask(documents: Any) -> BlockMask:
    """The block-causal BlockMask of the whole sequence for a micro-batch's document ids, built
    by the first layer and kept in `documents.cache` for the others.

    `documents` is what the trainer hands every attention layer under context parallel with
    document masking: an object with `ids` (batch, seq_len), the document of every token of the
    whole sequence in sequence order, and a `cache` dict that lives as long as the micro-batch
    (kenotron/parallel/context/documents.py's SequenceDocuments). A BlockMask is taken as is."""
    if isinstance(documents, BlockMask):
        return documents
    key = "ulysses_block_mask"
    if key not in documents.cache:
        documents.cache[key] = document_block_mask(documents.ids)
    return documents.cache[key]


class UlyssesAttention(nn.Module):
    """Drop-in `attention_fn` of an attention module under all-to-all context parallel (no parameters).

    `group`: the all-to-all's ranks (the whole cp group, or one all-to-all group of it when a
    ring spans the rest); `inner`: that ring's attention module over the ring sub-group (None:
    the whole sequence's kernel on this rank)."""

    takes_documents = True
    """The attention layers hand it the micro-batch's document ids under document masking
    (models/common/attention.py's `takes_documents`): it builds the whole sequence's mask, or
    hands the ids to the ring, which masks each chunk pair by them."""

    def __init__(self, group: dist.ProcessGroup, load_balance: bool = True, inner: nn.Module | None = None,
                 kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = causal_attention) -> None:
        super().__init__()
        self.group = group
        self.load_balance = load_balance
        self.inner = inner
        self.kernel = kernel
        """The plain causal kernel on the whole sequence of this rank's heads (`ulysses_attention`)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Any = None) -> torch.Tensor:
        """`documents`: None (causal), a whole-sequence BlockMask, or document ids (`whole_sequence_mask`)."""
        if self.inner is not None:
            ring = self.inner
            inner = ring if documents is None else functools.partial(ring, documents=documents)
            return ulysses_attention(q, k, v, self.group, load_balance=self.load_balance, inner=inner)
        mask = None if documents is None else whole_sequence_mask(documents)
        return ulysses_attention(q, k, v, self.group, load_balance=self.load_balance, block_mask=mask,
                                 kernel=self.kernel)

    def extra_repr(self) -> str:
        ring = f", ring={type(self.inner).__name__}" if self.inner is not None else ""
        kernel = "" if self.kernel is causal_attention else f", kernel={self.kernel!r}"
        return f"all-to-all={dist.get_world_size(self.group)}, load_balance={self.load_balance}{ring}{kernel}"
