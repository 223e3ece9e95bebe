"""A data loader of packed synthetic documents with a chosen mean length, for benchmarks of
document masking (scripts/bench_cp_documents.py).

    --data.loader scripts/packed_documents.py:build --data.path 4096 --data.document_masking true

Each window of seq_len + 1 tokens is random token ids cut into documents whose lengths are drawn
from an exponential distribution of mean `data.path` tokens (at least 1), each ending with the
tokenizer's EOS; the first document of a window may be the tail of one begun before, as in
packed real data. Seeded by step and row, so every rank of a cp group (which loads the same
rows) and every rerun sees the same windows. No file is read: the point is the mask's shape, the
tokens are noise.
"""

from __future__ import annotations

import torch

from kenotron.data import LoaderContext, MicroBatch


def packed_window(length: int, mean_tokens: float, vocab_size: int, eos_id: int, seed: int) -> torch.Tensor:
    """`length` random token ids below `vocab_size`, EOS only where a document of exponential
    length (mean `mean_tokens`) ends."""
    gen = torch.Generator().manual_seed(seed)
    window = torch.randint(0, vocab_size, (length,), generator=gen)
    window[window == eos_id] = 0
    draw = lambda: int(torch.empty(1).exponential_(1 / mean_tokens, generator=gen))
    at = draw() % length  # the window starts inside a document
    while at < length:
        window[at] = eos_id
        at += 1 + draw()
    return window


class PackedDocuments:
    """Random documents of mean length `mean_tokens`, packed into windows (the module docstring)."""

    def __init__(self, ctx: LoaderContext, mean_tokens: float) -> None:
        if mean_tokens < 1:
            raise ValueError(f"data.path={ctx.cfg.data.path!r} is not a mean document length >= 1 (tokens); "
                             f"e.g. --data.path 4096")
        self.ctx, self.mean_tokens, self.step = ctx, mean_tokens, 0

    def _window(self, row: int) -> torch.Tensor:
        ctx = self.ctx
        return packed_window(ctx.seq_len + 1, self.mean_tokens, ctx.vocab_size, ctx.tokenizer.eos_id,
                             seed=self.step * 1_000_003 + row)

    def next_step(self) -> list[MicroBatch]:
        ctx = self.ctx
        per_rank = ctx.global_batch_size // ctx.dp_size
        first = ctx.dp_rank * per_rank
        batch = torch.stack([self._window(first + i) for i in range(per_rank)])
        self.step += 1
        return [
            MicroBatch(chunk[:, :-1].contiguous() if ctx.feed_inputs else None,
                       chunk[:, 1:].contiguous() if ctx.feed_labels else None)
            for chunk in batch.split(ctx.local_batch_size)
        ]

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def build(ctx: LoaderContext) -> PackedDocuments:
    """The builder `data.loader` names; `data.path` holds the mean document length in tokens."""
    try:
        mean = float(ctx.cfg.data.path)
    except ValueError as e:
        raise ValueError(f"data.path={ctx.cfg.data.path!r} is not a mean document length in tokens; "
                         f"e.g. --data.path 4096") from e
    return PackedDocuments(ctx, mean)
