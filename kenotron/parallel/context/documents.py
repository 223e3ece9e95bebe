"""Document masking under context parallel: the block-causal mask of the whole sequence, cut
into the chunk pairs each rank attends.

With `data.document_masking` a query sees a key iff the key is at or before it *and* both lie
in the same document of the packed window. Under context parallel a rank holds some chunks of
the sequence (`SequenceLayout`: head-tail or contiguous) and attends them against every chunk
of every rank. The mask of one (query chunk, key chunk) pair is read off the document ids of
the *whole* sequence at the global positions of the two chunks, so it is exactly the slice of
the one-rank mask that pair covers, whatever the layout.

Every cp rank holds the whole micro-batch before the trainer slices it (apply.py's
SequenceSharder), so each one derives the document ids of the whole sequence itself
(`SequenceDocuments`): no collective carries them.

A pair whose mask is empty (no key of the key chunk in a document of the query chunk) is
skipped, forward and backward; `masked_work` counts how much of the causal work that skips,
for the throughput model and the bench.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node

from kenotron.parallel.context.layout import SequenceLayout

FLEX_BLOCK = 128
"""FlexAttention's block size (tokens per side): the granularity at which its kernels skip work."""


@dataclass
class SequenceDocuments:
    """The document of every token of the whole (unsharded) micro-batch, handed to the model in
    place of a FlexAttention BlockMask and by every attention layer to its context-parallel
    attention_fn."""

    ids: torch.Tensor
    """(batch, seq_len) document index of each token; only equality matters (data.packing.document_ids)."""
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    """What one attention built from the ids for the next layers of the same micro-batch (masks)."""

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]


# A pytree node whose child is the ids: torch's pipeline schedule splits them into its
# microbatches along the batch, as it splits tensors (kwargs reach every stage), and hooks that
# map over a forward's arguments (FSDP's casts) rebuild the object around the same ids. The
# cache travels as the node's context, so a rebuilt object shares it; its keys name the ids.
register_pytree_node(
    SequenceDocuments,
    lambda documents: ([documents.ids], documents.cache),
    lambda children, cache: SequenceDocuments(children[0], cache),
    serialized_type_name="kenotron.SequenceDocuments",
)


def check_documents(documents: object) -> SequenceDocuments | None:
    """`documents` as a context-parallel attention takes it: None or SequenceDocuments (a
    FlexAttention BlockMask of the whole sequence cannot be cut into a rank's chunk pairs)."""
    if documents is not None and not isinstance(documents, SequenceDocuments):
        raise TypeError(f"context-parallel attention masks by the whole sequence's document ids (SequenceDocuments), "
                        f"not a {type(documents).__name__}; build them with BlockMasks.documents(whole_inputs)")
    return documents


def chunk_ids(documents: torch.Tensor, layout: SequenceLayout, chunks: list[int] | tuple[int, ...]) -> torch.Tensor:
    """Document ids (batch, len(chunks) * chunk_len) of global chunks `chunks`, concatenated."""
    c = layout.chunk_len
    parts = [documents[:, i * c:(i + 1) * c] for i in chunks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def pair_mask(q_ids: torch.Tensor, k_ids: torch.Tensor, causal: bool) -> torch.Tensor | None | bool:
    """The mask of queries with document ids `q_ids` (batch, q) against keys `k_ids` (batch, k):
    None when every key is visible to every query, False when none is (skip the pair), else a
    boolean (batch, 1, 1, q, k) that broadcasts over the grouped heads of block_math.
    `causal`: the keys are the query chunk itself (positions aligned), so the triangle applies."""
    allowed = q_ids[:, :, None] == k_ids[:, None, :]
    if causal:
        allowed = allowed & torch.ones(allowed.shape[-2:], dtype=torch.bool, device=allowed.device).tril()
    elif bool(allowed.all()):
        return None
    if causal or bool(allowed.any()):
        return allowed[:, None, None]
    return False


@dataclass(frozen=True)
class MaskedWork:
    """How much of causal attention's work the document mask leaves, over one sequence layout."""

    causal_pairs: int
    """(query, key) pairs causal attention computes: seq (seq + 1) / 2 per row."""
    document_pairs: int
    """Pairs the document mask allows: the sum over documents of len (len + 1) / 2."""
    chunk_pairs: int
    """(query chunk, key chunk) pairs the ring computes under the causal mask."""
    chunk_pairs_kept: int
    """Of those, the pairs with at least one allowed entry (the ring skips the others)."""
    causal_blocks: int
    """FLEX_BLOCK x FLEX_BLOCK tiles a causal FlexAttention computes (fully or partly)."""
    document_blocks: int
    """Tiles with at least one allowed entry under the document mask (FlexAttention skips the rest)."""

    @property
    def kept_fraction(self) -> float:
        """Fraction of the causal attention FLOPs a fused block-sparse kernel still does."""
        return self.document_blocks / max(self.causal_blocks, 1)


def _blocks_kept(doc: torch.Tensor, block: int) -> tuple[int, int]:
    """(causal tiles, tiles with an allowed entry) of one row's document ids, in tiles of `block`."""
    n = (doc.numel() + block - 1) // block
    first = doc[::block]
    last = torch.cat([doc[block - 1::block], doc[-1:]])[:n]  # a short last tile ends at the row's end
    # Ids never decrease along a packed window: key tile j (<= query tile i) holds a key of a
    # query's document iff its last id reaches the query tile's first id.
    kept = (last[None, :] >= first[:, None]).tril()
    return n * (n + 1) // 2, int(kept.sum())


def masked_work(documents: torch.Tensor, layout: SequenceLayout, block: int = FLEX_BLOCK) -> MaskedWork:
    """Count what the document mask of `documents` (batch, seq_len), ids non-decreasing along a
    row as data.packing.document_ids gives them, leaves of causal attention's work."""
    batch, seq = documents.shape
    if seq != layout.seq_len:
        raise ValueError(f"document ids cover {seq} tokens but the layout splits seq_len={layout.seq_len}")
    causal_pairs = batch * seq * (seq + 1) // 2
    document_pairs = 0
    for row in documents:
        lengths = torch.unique_consecutive(row, return_counts=True)[1].to(torch.int64)
        document_pairs += int((lengths * (lengths + 1) // 2).sum())
    n, c = layout.n_chunks, layout.chunk_len
    chunk_first, chunk_last = documents[:, ::c], documents[:, c - 1::c]
    kept = (chunk_last[:, None, :] >= chunk_first[:, :, None]).tril()  # (batch, query chunk, key chunk)
    causal_blocks = document_blocks = 0
    for row in documents:
        total, kept_blocks = _blocks_kept(row, block)
        causal_blocks, document_blocks = causal_blocks + total, document_blocks + kept_blocks
    return MaskedWork(causal_pairs, document_pairs, batch * n * (n + 1) // 2, int(kept.sum()),
                      causal_blocks, document_blocks)
