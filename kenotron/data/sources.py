"""Datasets as windows of tokens: random-access sources and sequential ones.

Two kinds, told apart by their methods:

- random access (`windows(indices, window_len)`): window k of the dataset, for any k; k past
  the end wraps into the next epoch. Pre-tokenized folders (`TokenizedWindows`, shuffled per
  epoch) and synthetic tokens. They hold no state: the loader's counters say which windows
  were used, so each rank reads only its own windows.
- sequential (`next_window()`, optionally `skip_window()`, `state_dict()` / `load_state_dict()`,
  and a `seq_len` attribute the loader may change): a stream that must be read in order, such
  as raw text packed on the fly (`PackedWindows`). Where window k starts is only known after
  tokenizing everything before it, so every rank reads the stream (skipping other ranks'
  windows without building them) and the state stays the same on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kenotron.data.shuffle import Permutation
from kenotron.data.token_files import TokenizedFolder


def is_random_access(source: Any) -> bool:
    return callable(getattr(source, "windows", None))


class TokenizedWindows:
    """Windows of a tokenized folder's token stream, in a seeded order that changes every epoch.

    With `shuffle`, window k of epoch e = k // n is physical window perm_e[k % n] of the n
    windows that fit in the folder; without, it is window k % n. The order depends only on
    (seed, epoch, n), never on the parallel layout.
    """

    def __init__(self, folder: TokenizedFolder, shuffle: bool = True, seed: int = 0, name: str = "") -> None:
        self.folder = folder
        self.shuffle = shuffle
        self.seed = seed
        self.name = name or folder.folder.name
        self._permutation: Permutation | None = None

    def num_windows(self, window_len: int) -> int:
        n = self.folder.num_tokens // window_len
        if n == 0:
            raise ValueError(
                f"{self.folder.folder} holds {self.folder.num_tokens} tokens, fewer than one window of {window_len} "
                f"(seq_len + 1); give more data or a shorter training.seq_len"
            )
        return n

    def _order(self, n: int, epoch: int) -> Permutation:
        p = self._permutation
        if p is None or p.n != n or p.epoch != epoch:
            p = Permutation(n, self.seed, epoch)
            p.epoch = epoch  # type: ignore[attr-defined]
            self._permutation = p
        return p

    def windows(self, indices: np.ndarray, window_len: int) -> np.ndarray:
        n = self.num_windows(window_len)
        indices = np.asarray(indices, dtype=np.int64)
        physical = indices % n
        if self.shuffle:
            epochs = indices // n
            for epoch in np.unique(epochs):
                chosen = epochs == epoch
                physical[chosen] = self._order(n, int(epoch))[physical[chosen]]
        out = np.empty((len(indices), window_len), dtype=np.int64)
        for row, window in enumerate(physical.tolist()):
            self.folder.read(window * window_len, window_len, out=out[row])
        return out


class SyntheticWindows:
    """Uniform random token ids in [0, vocab_size), for benchmarks that must not wait on data.

    Window k depends only on (seed, k): reproducible, random access, microseconds per window.
    The loss cannot fall below ln(vocab): use it to measure speed and memory, not learning.
    """

    def __init__(self, vocab_size: int, seed: int = 0, name: str = "synthetic") -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1")
        self.vocab_size = vocab_size
        self.seed = seed
        self.name = name

    def windows(self, indices: np.ndarray, window_len: int) -> np.ndarray:
        out = np.empty((len(indices), window_len), dtype=np.int64)
        for row, k in enumerate(np.asarray(indices).tolist()):
            out[row] = np.random.default_rng((self.seed, k)).integers(0, self.vocab_size, window_len)
        return out
