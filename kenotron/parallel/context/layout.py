"""Which tokens of a sequence each context-parallel rank holds.

Causal attention does more work for late tokens than for early ones (query i looks at i + 1
keys). Cutting the sequence into `cp` contiguous pieces would leave the last rank with about
twice the average work. With load balancing the sequence is cut into `2 * cp` equal chunks and
rank r holds chunks r and 2*cp - 1 - r (a head and a tail chunk), so every rank does the same
amount of attention. This is the layout of torch's own head-tail load balancer, which its
context-parallel attention assumes; kenotron's ring attention accepts either layout.

A rank's local sequence is its chunks concatenated in increasing chunk order; RoPE must see the
*global* position of every local token, which `positions` gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceLayout:
    """How `seq_len` tokens are split over `cp` context-parallel ranks."""

    seq_len: int
    """Tokens in the whole (unsharded) sequence."""
    cp: int
    """Context-parallel degree: how many ranks share one sequence."""
    load_balance: bool = True
    """Head-tail layout (rank r holds chunks r and 2*cp-1-r of 2*cp); False: contiguous chunk r of cp."""

    def __post_init__(self) -> None:
        if self.cp < 1:
            raise ValueError(f"context-parallel degree cp={self.cp} must be >= 1")
        if self.seq_len % self.n_chunks != 0:
            what = "2 x cp" if self.load_balance else "cp"
            raise ValueError(
                f"seq_len={self.seq_len} is not divisible by {what} = {self.n_chunks} "
                f"(load_balance={self.load_balance}); use a multiple of {self.n_chunks}"
            )

    @property
    def n_chunks(self) -> int:
        """Equal chunks the sequence is cut into."""
        return 2 * self.cp if self.load_balance else self.cp

    @property
    def chunk_len(self) -> int:
        return self.seq_len // self.n_chunks

    @property
    def local_len(self) -> int:
        """Tokens each rank holds."""
        return self.seq_len // self.cp

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """Global chunk indices rank `rank` holds, in the order they sit in its local sequence."""
        if not 0 <= rank < self.cp:
            raise ValueError(f"rank {rank} is outside the context-parallel group of {self.cp}")
        if self.load_balance:
            return (rank, self.n_chunks - 1 - rank)
        return (rank,)

    def positions(self, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Global positions (local_len,) of rank `rank`'s tokens: its RoPE position ids."""
        return torch.cat(
            [torch.arange(c * self.chunk_len, (c + 1) * self.chunk_len, device=device) for c in self.chunks_of(rank)]
        )

    def shard(self, x: torch.Tensor, rank: int, dim: int = 1) -> torch.Tensor:
        """Rank `rank`'s slice of `x` along `dim` (which must have seq_len entries)."""
        if x.shape[dim] != self.seq_len:
            raise ValueError(f"dimension {dim} of a tensor of shape {tuple(x.shape)} is not the sequence ({self.seq_len})")
        parts = [x.narrow(dim, c * self.chunk_len, self.chunk_len) for c in self.chunks_of(rank)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)

    def unshard(self, shards: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
        """The whole sequence from every rank's slice (rank order), e.g. to compare with a reference."""
        if len(shards) != self.cp:
            raise ValueError(f"expected {self.cp} shards (one per rank), got {len(shards)}")
        chunks: list[torch.Tensor | None] = [None] * self.n_chunks
        for rank, shard in enumerate(shards):
            for i, c in enumerate(self.chunks_of(rank)):
                chunks[c] = shard.narrow(dim, i * self.chunk_len, self.chunk_len)
        return torch.cat(chunks, dim=dim)  # type: ignore[arg-type]


@dataclass
class ContextShard:
    """One rank's part of a micro-batch under context parallel."""

    inputs: torch.Tensor
    """Token ids (batch, local_len)."""
    labels: torch.Tensor
    """Next-token labels (batch, local_len), aligned with `inputs`."""
    positions: torch.Tensor
    """Global positions (local_len,) of the local tokens: the model's RoPE position ids."""


def shard_batch(inputs: torch.Tensor, labels: torch.Tensor, layout: SequenceLayout, rank: int) -> ContextShard:
    """Slice a (batch, seq_len) micro-batch for one rank.

    Labels are already shifted (label t is the token after input t), so slicing both the same way
    keeps every pair together and each rank's loss covers exactly its own tokens.
    """
    return ContextShard(
        layout.shard(inputs, rank), layout.shard(labels, rank), layout.positions(rank, device=inputs.device)
    )
