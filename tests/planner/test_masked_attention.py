"""The masked attention work the throughput model prices (planner/masked_attention.py): its tile
counts equal documents.masked_work's, per rank those of a dense count, its expectation that of
the packed-documents loader's windows; the ring waits for its busiest rank, the all-to-all does
not, the composition over its ring part; estimate, --search and the CLI say what they assumed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kenotron.config import load_config
from kenotron.parallel.context.documents import FLEX_BLOCK, masked_work
from kenotron.parallel.context.layout import SequenceLayout
from kenotron.planner.masked_attention import (
    DEFAULT_DOCUMENT_TOKENS,
    document_attention,
    document_lengths,
    document_starts,
    document_work,
    rank_tiles,
    tiles_kept_per_query_tile,
)
from kenotron.train.resolve import resolve_run

ROOT = Path(__file__).resolve().parents[2]


def _ids(starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(1, seq_len) document ids of a window whose documents start at `starts`."""
    border = torch.zeros(seq_len, dtype=torch.int64)
    border[starts[1:]] = 1
    return border.cumsum(0)[None]


@pytest.mark.parametrize("seq_len,mean", [(4096, 300.0), (8192, 1000.0), (1000, 50.0), (2048, 5000.0)])
def test_tiles_kept_per_query_tile_add_up_to_the_tiles_masked_work_counts(seq_len, mean):
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        starts = document_starts(seq_len, mean, gen)
        counted = masked_work(_ids(starts, seq_len), SequenceLayout(seq_len, 1, load_balance=False))
        assert int(tiles_kept_per_query_tile(starts, seq_len).sum()) == counted.document_blocks


@pytest.mark.parametrize("cp,load_balance", [(2, True), (4, True), (4, False)])
def test_rank_tiles_equal_a_dense_count_of_each_ranks_query_tiles(cp, load_balance):
    seq_len, gen = 8192, torch.Generator().manual_seed(2)
    layout = SequenceLayout(seq_len, cp, load_balance)
    starts = document_starts(seq_len, 700.0, gen)
    ids = _ids(starts, seq_len)[0]
    first, last = ids[::FLEX_BLOCK], ids[FLEX_BLOCK - 1::FLEX_BLOCK]
    kept = ((last[None, :] >= first[:, None]) & torch.ones(len(first), len(first), dtype=torch.bool).tril()).sum(1)
    dense = [int(sum(kept[c * layout.chunk_len // FLEX_BLOCK:(c + 1) * layout.chunk_len // FLEX_BLOCK].sum()
                     for c in layout.chunks_of(rank))) for rank in range(cp)]
    assert rank_tiles(starts, layout).tolist() == dense


def test_expected_work_matches_the_packed_documents_loaders_windows():
    spec = importlib.util.spec_from_file_location("packed_documents", ROOT / "scripts" / "packed_documents.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    seq_len, mean, kept = 16384, 1024, []
    for seed in range(24):
        window = loader.packed_window(seq_len + 1, mean, vocab_size=2, eos_id=1, seed=seed)[:-1]
        ids = (torch.cumsum(window == 1, 0) - (window == 1).long())[None]
        kept.append(masked_work(ids, SequenceLayout(seq_len, 1, load_balance=False)).kept_fraction)
    assert document_work(seq_len, float(mean), 1).kept == pytest.approx(sum(kept) / len(kept), rel=0.1)
    # Exponential lengths leave about twice the tiles of equal ones ((D + 128) / s): E[L^2] = 2 mean^2.
    assert document_work(seq_len, float(mean), 1).kept > 1.6 * (mean + FLEX_BLOCK) / seq_len


def test_the_ring_waits_for_its_busiest_rank_more_as_it_grows_and_less_with_longer_windows():
    document_work.cache_clear()
    first = document_work(32768, 4096.0, 2)
    assert document_work(32768, 4096.0, 2) == first  # a fixed seed: the same figures every pricing
    document_work.cache_clear()
    assert document_work(32768, 4096.0, 2) == first
    assert document_work(32768, 4096.0, 1).ring_imbalance == 1.0
    assert 1.1 < first.ring_imbalance < document_work(32768, 4096.0, 4).ring_imbalance
    assert document_work(131072, 4096.0, 2).ring_imbalance < first.ring_imbalance
    assert document_work(32768, 4096.0, 2, rows=8).ring_imbalance < first.ring_imbalance  # rows even it out


def _run(scheme: str, *extra: str, ngpu: int = 4):
    overrides = ["--parallelism.cp", "4", "--training.seq_len", "8192", "--data.document_masking", "true",
                 "--parallelism.cp_scheme", scheme, *extra]
    return resolve_run(load_config("debug", overrides), ngpu, check_data=False)


def test_the_all_to_all_is_even_the_ring_is_not_and_the_composition_waits_over_its_ring_part():
    ring, ulysses = document_attention(_run("ring"), 512), document_attention(_run("ulysses"), 512)
    # debug's 8 heads, 4 kv heads split over all 4 cp ranks: no ring under Ulysses.
    assert (ring.ring, ulysses.ring) == (4, 1)
    assert ulysses.busiest_share == ulysses.work.kept < ring.busiest_share
    heads = ("--model.n_heads", "2", "--model.n_kv_heads", "2")  # the all-to-all over 2 ranks, a ring of 2
    composed = document_attention(_run("ulysses", *heads), 512)
    assert composed.ring == 2
    assert composed.work == document_work(8192, 512.0, 2, True, rows=4)  # debug: 4 sequences per micro-step
    assert 1.0 < composed.work.ring_imbalance < ring.work.ring_imbalance
    assert document_attention(_run("ring", "--data.document_masking", "false"), 512) is None


def test_the_mean_document_length_comes_from_the_flag_then_the_loader_then_the_default():
    cfg = load_config("debug", ["--data.loader", "scripts/packed_documents.py:build", "--data.path", "2048"])
    assert document_lengths(cfg, 300).mean_tokens == 300
    assert document_lengths(cfg).mean_tokens == 2048 and "data.path" in document_lengths(cfg).source
    assert document_lengths(load_config("debug", [])).mean_tokens == DEFAULT_DOCUMENT_TOKENS
    with pytest.raises(ValueError, match=r"document_tokens=0.5 is not a mean document length; use a value >= 1"):
        document_lengths(cfg, 0.5)


def test_chunks_shorter_than_a_tile_are_split_over_the_ring_at_their_own_length():
    # 512 tokens over 4 ranks: head-tail chunks of 64 tokens. One document: at 64-token tiles
    # every rank keeps the same causal share (tiles r and 7 - r: r + 1 + 8 - r).
    assert rank_tiles(torch.tensor([0]), SequenceLayout(512, 4), 64).tolist() == [9, 9, 9, 9]
    # Counted in 128-token tiles the 4 tiles' first tokens sit in chunks 0, 2, 4, 6 (ranks 0, 2, 3,
    # 1: 1, 4, 2, 3 tiles), an imbalance that comes from the counting, not the documents.
    assert rank_tiles(torch.tensor([0]), SequenceLayout(512, 4), 128).tolist() == [1, 4, 2, 3]
    assert document_work(512, 1e9, 4).ring_imbalance < 1.25
