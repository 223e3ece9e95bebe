"""Train a byte-level BPE vocabulary and write it as a tiktoken rank file.

Ranks 0..255 are the single bytes (rank = byte value); every later rank is one merge, in the
order it was learned, so tiktoken's "merge the adjacent pair of lowest rank" reproduces the
training segmentation. Text is first split with the same pre-tokenizer pattern the tokenizer
uses, so merges never cross piece boundaries.

Speed comes from working on unique pieces ("words") weighted by their frequency, and from an
incremental index: pair -> count and pair -> words containing it, with a lazy max-heap over
counts. A merge only touches the words that contain the merged pair.

Determinism: the pair to merge is the one with the highest count; ties go to the smallest
(left id, right id). Ids depend only on the merge history, so the result is a function of the
word counts alone, independent of dict or set iteration order.
"""

from __future__ import annotations

import base64
import heapq
import itertools
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import regex

from kenotron.data.tiktoken_bpe import write_sidecar
from kenotron.data.tokenizer import LLAMA3_SPLIT_PATTERN

Pair = tuple[int, int]


def count_pieces(documents: Iterable[str], pattern: str = LLAMA3_SPLIT_PATTERN) -> Counter[bytes]:
    """Frequency of every pre-tokenized piece (as UTF-8 bytes) over `documents`."""
    splitter = regex.compile(pattern)
    text_counts: Counter[str] = Counter()
    for document in documents:
        text_counts.update(splitter.findall(document))
    return Counter({piece.encode("utf-8"): n for piece, n in text_counts.items()})


def _merge_word(word: list[int], pair: Pair, new_id: int) -> list[int]:
    """`word` with every non-overlapping occurrence of `pair`, left to right, replaced by new_id."""
    left, right = pair
    merged: list[int] = []
    i = 0
    last = len(word) - 1
    while i <= last:
        if i < last and word[i] == left and word[i + 1] == right:
            merged.append(new_id)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


class _PairIndex:
    """Pair counts over weighted words, the words holding each pair, and a lazy max-heap."""

    def __init__(self, words: list[list[int]], weights: list[int]) -> None:
        self.words = words
        self.weights = weights
        self.counts: dict[Pair, int] = {}
        self.holders: dict[Pair, set[int]] = {}
        for index, word in enumerate(words):
            for pair in itertools.pairwise(word):
                self.counts[pair] = self.counts.get(pair, 0) + weights[index]
                self.holders.setdefault(pair, set()).add(index)
        # Entries are (-count, left, right): the heap top is the highest count, then the
        # smallest ids. Stale entries (count changed since the push) are skipped on pop.
        self.heap = [(-count, a, b) for (a, b), count in self.counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self) -> Pair | None:
        """The pair to merge next, or None when no pair is left."""
        while self.heap:
            negative_count, a, b = heapq.heappop(self.heap)
            if self.counts.get((a, b), 0) == -negative_count:
                return (a, b)
        return None

    def merge(self, pair: Pair, new_id: int) -> None:
        """Replace `pair` by `new_id` in every word holding it and update counts and heap."""
        changed: set[Pair] = set()
        for index in self.holders.pop(pair, set()):
            old_word = self.words[index]
            new_word = _merge_word(old_word, pair, new_id)
            weight = self.weights[index]
            old_pairs = Counter(itertools.pairwise(old_word))
            new_pairs = Counter(itertools.pairwise(new_word))
            for p, n in old_pairs.items():
                self.counts[p] -= n * weight
                if p not in new_pairs and p != pair:
                    self.holders[p].discard(index)
                changed.add(p)
            for p, n in new_pairs.items():
                self.counts[p] = self.counts.get(p, 0) + n * weight
                self.holders.setdefault(p, set()).add(index)
                changed.add(p)
            self.words[index] = new_word
        for p in changed:
            count = self.counts[p]
            if count > 0:
                heapq.heappush(self.heap, (-count, p[0], p[1]))
            else:
                del self.counts[p]
                self.holders.pop(p, None)


def train_bpe(
    documents: Iterable[str], num_ranks: int, pattern: str = LLAMA3_SPLIT_PATTERN
) -> dict[bytes, int]:
    """Learn a byte-level BPE of exactly `num_ranks` tokens (256 bytes + merges) on `documents`.

    Returns token bytes -> rank, the mapping tiktoken takes as `mergeable_ranks`.
    """
    if num_ranks < 256:
        raise ValueError(f"num_ranks={num_ranks} is below 256; the 256 single bytes come first")
    piece_counts = count_pieces(documents, pattern)
    # Sorted so the word list (and every tie between equal counts) is the same in any process.
    pieces = sorted(piece_counts)
    index = _PairIndex([list(piece) for piece in pieces], [piece_counts[p] for p in pieces])

    token_bytes: list[bytes] = [bytes([b]) for b in range(256)]
    id_of_bytes: dict[bytes, int] = {t: i for i, t in enumerate(token_bytes)}
    while len(token_bytes) < num_ranks:
        pair = index.pop_best()
        if pair is None:
            raise ValueError(
                f"the corpus ran out of pairs to merge after {len(token_bytes)} ranks; "
                f"give more text or ask for fewer than num_ranks={num_ranks}"
            )
        merged = token_bytes[pair[0]] + token_bytes[pair[1]]
        # Two different splits can build the same bytes (ab+c and a+bc): reuse the existing
        # token so the rank file stays a bijection, and spend no rank on it.
        new_id = id_of_bytes.get(merged)
        if new_id is None:
            new_id = len(token_bytes)
            token_bytes.append(merged)
            id_of_bytes[merged] = new_id
        index.merge(pair, new_id)
    return id_of_bytes


def write_rank_file(ranks: dict[bytes, int], path: str | Path, pattern: str = LLAMA3_SPLIT_PATTERN) -> None:
    """Write `ranks` as a tiktoken rank file (`base64(token) rank` per line, in rank order), and
    the split pattern the vocabulary was trained with beside it (`<path>.json`)."""
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {rank}\n"
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.writelines(lines)
    write_sidecar(path, pattern)
