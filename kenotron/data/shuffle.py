"""A seeded permutation of [0, n) with O(1) memory and O(1) work per element.

Shuffling the windows of a large tokenized folder with `rng.permutation(n)` would hold n int64
(2 GB for a 1T-token folder at 4k windows) on every rank. Instead the order is a bijection
computed per index: a balanced Feistel network over the smallest even number of bits that
covers n, with "cycle walking" (apply it again while the value is >= n, which ends because the
network is a permutation of its larger domain). The round keys come from (seed, epoch), so
each epoch gets another order, and the order does not depend on the parallel layout.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-spread hash of uint64 values (arrays wrap silently)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


class Permutation:
    """`perm[i]` for i in [0, n): a bijection of [0, n) fixed by (n, seed, epoch)."""

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        if n < 1:
            raise ValueError(f"cannot permute {n} elements")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.half_mask = np.uint64((1 << self.half) - 1)
        self.shift = np.uint64(self.half)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, epoch])
        self.keys = rng.integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)

    def _network(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.shift, x & self.half_mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right + key) & self.half_mask)
        return (left << self.shift) | right

    def __getitem__(self, index: np.ndarray | int) -> np.ndarray:
        x = np.asarray(index, dtype=np.uint64)
        if x.size and (int(x.max()) >= self.n):
            raise IndexError(f"index {int(x.max())} is outside the permutation of {self.n} elements")
        out = self._network(x.ravel())
        outside = out >= self.n
        while outside.any():  # cycle walking back into [0, n)
            out[outside] = self._network(out[outside])
            outside = out >= self.n
        return out.astype(np.int64).reshape(x.shape)
