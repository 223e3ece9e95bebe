"""Synthetic token windows: uniform random ids, for benchmarks that must not wait on data.

Window k depends only on (seed, k), so the stream is reproducible, resumable (its state is
the window index) and costs microseconds per window. The loss cannot fall below ln(vocab):
use it to measure speed and memory, not learning.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SyntheticWindows:
    """A WindowSource of `seq_len + 1` random token ids in [0, vocab_size)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0) -> None:
        if vocab_size < 1 or seq_len < 1:
            raise ValueError(f"vocab_size={vocab_size} and seq_len={seq_len} must be >= 1")
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.index = 0

    def next_window(self) -> np.ndarray:
        rng = np.random.default_rng((self.seed, self.index))
        self.index += 1
        return rng.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
