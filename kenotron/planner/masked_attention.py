"""The attention work a document mask leaves under context parallel, as the throughput model
prices it (throughput.py): the expected share of causal attention's tiles the fused kernel still
computes, and under the ring the busiest rank's share over the mean.

The documents. A packed window of `seq_len` tokens holds documents whose lengths follow the
data's distribution. What a config states of it: the packed-documents loader
(scripts/packed_documents.py, `data.loader = "…packed_documents.py:build"`) takes `data.path` as
the mean length of exponentially distributed documents; `kenotron estimate --document-tokens N`
states a mean for any data. Otherwise the model assumes that loader's distribution at
DEFAULT_DOCUMENT_TOKENS (the mean the measured document-masked GPU rows ran with; a corpus's own
lengths are not read: state their mean with --document-tokens). Lengths are 1 + floor(Exp(mean)) tokens and a window starts inside a
document, as the loader draws them.

The work. FlexAttention skips the FLEX_BLOCK x FLEX_BLOCK tiles the mask empties and computes
the others whole, so a rank's work is the tiles its queries keep (documents.masked_work counts
the same tiles; tests/planner/test_masked_attention.py checks the two agree). Under the ring
(and the ring part of the all-to-all inside a ring) a rank computes its own chunks' queries
against every key: the documents leave the ranks uneven work, and each layer waits for the
busiest. Under the all-to-all every rank computes every query of its heads: even work.

Sampled, not solved: SAMPLES micro-batches of windows from a fixed seed, the per-rank tiles
counted in O(tiles) each (a query tile keeps the key tiles from its first token's document
start to itself), cached per shape; a layout search prices thousands of layouts from a handful
of shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from kenotron.config import JobConfig
from kenotron.parallel.context.documents import FLEX_BLOCK
from kenotron.parallel.context.layout import SequenceLayout
from kenotron.train.resolve import ResolvedRun

DEFAULT_DOCUMENT_TOKENS = 4096
"""Mean document length (tokens) assumed when neither the loader nor --document-tokens states one."""
PACKED_DOCUMENTS_LOADER = "packed_documents.py:build"
"""The end of `data.loader` that names scripts/packed_documents.py, whose data.path is the mean length."""
SAMPLES = 32
"""Micro-batches of windows drawn per shape (the expectation's sample)."""
MAX_ROWS = 8
"""Rows per sampled micro-batch at most: more rows sum to evener rank work still, priced at this many's."""
SEED = 0
"""The sampler's fixed seed: every pricing of a shape gives the same figures."""


@dataclass(frozen=True)
class DocumentLengths:
    """The packed documents' length distribution the model prices: exponential of a mean."""

    mean_tokens: float
    """Mean document length in tokens."""
    source: str
    """Where the mean comes from, in words (the loader's data.path, --document-tokens, the default)."""


def document_lengths(cfg: JobConfig, stated_tokens: float | None = None) -> DocumentLengths:
    """The distribution `cfg`'s data packs (module docstring): `stated_tokens` (--document-tokens)
    first, then the packed-documents loader's data.path, else the default."""
    if stated_tokens is not None:
        if not stated_tokens >= 1:
            raise ValueError(f"document_tokens={stated_tokens} is not a mean document length; use a value >= 1 (tokens)")
        return DocumentLengths(float(stated_tokens), "--document-tokens")
    if cfg.data.loader.endswith(PACKED_DOCUMENTS_LOADER):
        try:
            mean = float(cfg.data.path)
        except ValueError:
            mean = 0.0
        if mean >= 1:
            return DocumentLengths(mean, "the packed-documents loader's data.path")
    return DocumentLengths(float(DEFAULT_DOCUMENT_TOKENS), "default; --document-tokens N states the data's")


def document_starts(seq_len: int, mean_tokens: float, gen: torch.Generator) -> torch.Tensor:
    """Sorted start positions of the documents of one window (the first at 0: the window begins
    inside a document), lengths 1 + floor(Exp(mean)) as the packed-documents loader draws them."""
    starts = [torch.zeros(1, dtype=torch.int64)]
    first = int(torch.empty(1, dtype=torch.float64).exponential_(1 / mean_tokens, generator=gen)) % seq_len + 1
    at, draws = first, int(seq_len / mean_tokens) + 16
    while at < seq_len:
        lengths = 1 + torch.empty(draws, dtype=torch.float64).exponential_(1 / mean_tokens, generator=gen).long()
        positions = at + torch.cumsum(lengths, 0) - lengths
        starts.append(positions[positions < seq_len])
        at = int(positions[-1] + lengths[-1])
    return torch.cat(starts)


def tiles_kept_per_query_tile(starts: torch.Tensor, seq_len: int, block: int = FLEX_BLOCK) -> torch.Tensor:
    """Key tiles each query tile of a window keeps under its document mask: from the tile of the
    start of its first token's document to itself (ids only grow along a window, so every key
    tile in between holds a key of that document; none before does)."""
    n = -(-seq_len // block)
    first_token = torch.arange(n, dtype=torch.int64) * block
    doc_start = starts[torch.searchsorted(starts, first_token, right=True) - 1]
    return torch.arange(n, dtype=torch.int64) - doc_start // block + 1


@dataclass(frozen=True)
class DocumentWork:
    """Expected attention work of document-masked windows of one shape."""

    kept: float
    """Share of causal attention's tiles the mask leaves (what a block-sparse kernel computes)."""
    ring_imbalance: float
    """The busiest ring rank's tiles over the mean rank's (1 without a ring)."""


def rank_of_query_tile(layout: SequenceLayout, block: int = FLEX_BLOCK) -> torch.Tensor:
    """The rank whose queries each query tile of the whole sequence holds (by its first token)."""
    n = -(-layout.seq_len // block)
    rank_of_chunk = torch.empty(layout.n_chunks, dtype=torch.int64)
    for rank in range(layout.cp):
        rank_of_chunk[list(layout.chunks_of(rank))] = rank
    return rank_of_chunk[torch.arange(n, dtype=torch.int64) * block // layout.chunk_len]


def rank_tiles(starts: torch.Tensor, layout: SequenceLayout, block: int = FLEX_BLOCK) -> torch.Tensor:
    """Tiles (cp,) each rank's queries keep in one window whose documents start at `starts`."""
    per_query_tile = tiles_kept_per_query_tile(starts, layout.seq_len, block)
    return torch.zeros(layout.cp, dtype=torch.int64).index_add_(0, rank_of_query_tile(layout, block), per_query_tile)


@lru_cache(maxsize=256)
def document_work(seq_len: int, mean_tokens: float, ring: int, load_balance: bool = True, rows: int = 1,
                  block: int = FLEX_BLOCK) -> DocumentWork:
    """Sampled expectation (module docstring) for windows of `seq_len` tokens of documents of mean
    `mean_tokens`, `rows` windows per micro-batch, the queries split over a ring of `ring` ranks
    in the head-tail (`load_balance`) or contiguous layout: kept = E[tiles kept] / causal tiles,
    ring_imbalance = E[max over ranks of a micro-batch's tiles] / E[mean over ranks]."""
    if mean_tokens < 1 or seq_len < 1 or ring < 1 or rows < 1:
        raise ValueError(f"seq_len={seq_len}, mean_tokens={mean_tokens}, ring={ring}, rows={rows} must all be >= 1")
    gen = torch.Generator().manual_seed(SEED)
    n = -(-seq_len // block)
    layout = SequenceLayout(seq_len, ring, load_balance)
    # A rank's kernel tiles its own queries: chunks shorter than a tile (or not a multiple of
    # one) are split over the ranks at the finer granularity both divide.
    rank_block = block if layout.chunk_len % block == 0 else math.gcd(block, layout.chunk_len)
    kept = busiest = mean = 0
    rows_drawn = min(rows, MAX_ROWS)
    for _ in range(SAMPLES):
        per_rank = torch.zeros(ring, dtype=torch.int64)
        for _ in range(rows_drawn):
            starts = document_starts(seq_len, mean_tokens, gen)
            per_rank += rank_tiles(starts, layout, rank_block)
            kept += int(tiles_kept_per_query_tile(starts, seq_len, block).sum()) if rank_block != block else 0
        kept += int(per_rank.sum()) if rank_block == block else 0
        busiest += int(per_rank.max())
        mean += int(per_rank.sum())
    return DocumentWork(kept / (SAMPLES * rows_drawn * n * (n + 1) // 2), busiest * ring / mean)


@dataclass(frozen=True)
class DocumentAttention:
    """What the throughput model prices a document-masked run's attention at, and why."""

    lengths: DocumentLengths
    """The documents assumed."""
    work: DocumentWork
    """Their expected work at the run's sequence length, ring degree and rows per micro-batch."""
    ring: int
    """Ranks of the ring that splits the queries (cp under the ring, cp / the all-to-all's
    degree under the all-to-all; 1: every rank computes every query of its heads)."""

    @property
    def busiest_share(self) -> float:
        """The busiest rank's attention tiles as a share of its causal ones: what a layer waits for."""
        return self.work.kept * self.work.ring_imbalance

    def describe(self) -> str:
        """One line: the documents and the work assumed."""
        ranks = (f"ring busiest rank {self.work.ring_imbalance:.2f}x the mean ({self.ring} ranks)" if self.ring > 1
                 else "ranks even (no ring)")
        return (f"document masking: exponential documents of mean {self.lengths.mean_tokens:,.0f} tokens "
                f"({self.lengths.source}), attention work {self.work.kept:.3f} of causal, {ranks}")


def ring_degree(run: ResolvedRun) -> int:
    """Ranks of the ring that splits `run`'s queries (DocumentAttention.ring); an unsettled "auto"
    runs the ring (cp_scheme_choice.py)."""
    settings, cp = run.plan.settings, run.dims.cp
    if settings.cp_scheme == "ulysses":
        return cp // (settings.cp_ulysses_degree or cp)
    return cp


def document_attention(run: ResolvedRun, document_tokens: float | None = None) -> DocumentAttention | None:
    """The attention `run` is priced at under data.document_masking (None without it), for
    documents of mean `document_tokens` if stated (document_lengths otherwise)."""
    if not run.cfg.data.document_masking:
        return None
    lengths = document_lengths(run.cfg, document_tokens)
    t, ring = run.cfg.training, ring_degree(run)
    rows = t.local_batch_size
    if run.plan.pipeline is not None and run.dims.pp > 1:
        rows = max(1, rows // run.plan.pipeline.microbatches)
    work = document_work(t.seq_len, lengths.mean_tokens, ring, run.cfg.tuning.cp_load_balance, rows)
    return DocumentAttention(lengths, work, ring)


def describe_priced(priced: list[DocumentAttention]) -> str:
    """One line for a search: the documents, the work of the best row (`priced` best first) and
    the ring's busiest rank at each ring degree among the rows (its best row's)."""
    best = priced[0]
    rings: dict[int, float] = {}
    for documents in priced:
        if documents.ring > 1:
            rings.setdefault(documents.ring, documents.work.ring_imbalance)
    ranks = ("ring busiest rank " + ", ".join(f"{imbalance:.2f}x the mean at {ring} ranks"
                                              for ring, imbalance in sorted(rings.items()))
             if rings else "no ring in these rows")
    return (f"document masking: exponential documents of mean {best.lengths.mean_tokens:,.0f} tokens "
            f"({best.lengths.source}), attention work {best.work.kept:.3f} of causal, {ranks} (all-to-all: even)")
