"""The data loader: global batches that do not depend on the parallel layout.

Contract: the global batch of step s is the same set of sequences whatever the data-parallel
degree D and the micro-batch size b. With G = global_batch_size:

- step s is windows [s*G, (s+1)*G) of the packed stream;
- dp rank r takes the contiguous slice [r*G/D, (r+1)*G/D) of it,
- and splits it, in order, into A = G/(D*b) micro-batches of b sequences (gradient
  accumulation steps).

So a run on 8 GPUs and its replay on 1 GPU with 8x accumulation see the same data, and a
checkpoint taken under one layout resumes under another.

The cost, for text sources: every rank tokenizes the whole stream and drops the other ranks'
windows, because where window k starts in the documents is only known after tokenizing
everything before it. Tokenizing is cheap next to a training step (tiktoken, several
threads); pre-tokenized sources can later skip this by indexing windows directly.

State is the step count and the window source's state at the step boundary; since every rank
reads every window, it is the same on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from kenotron.data.packing import PackedWindows
from kenotron.data.synthetic import SyntheticWindows
from kenotron.data.text_source import open_documents
from kenotron.data.tokenizer import Tokenizer

logger = logging.getLogger("kenotron")


class WindowSource(Protocol):
    """Anything that yields windows of seq_len + 1 token ids and can save its position."""

    def next_window(self) -> np.ndarray: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class MicroBatch:
    """b sequences: `inputs` and `labels` (inputs shifted by one), int64 [b, seq_len] on CPU."""

    inputs: torch.Tensor
    labels: torch.Tensor


def check_batch_sizes(global_batch_size: int, local_batch_size: int, dp_size: int) -> None:
    """Raise a clear error unless global_batch_size splits into dp_size x local_batch_size."""
    if local_batch_size < 1:
        raise ValueError(f"training.local_batch_size={local_batch_size} must be at least 1")
    if dp_size < 1:
        raise ValueError(f"dp_size={dp_size} must be at least 1")
    if global_batch_size < 1:
        raise ValueError(
            f"training.global_batch_size={global_batch_size} must be at least 1 "
            "(or -1 for local_batch_size x dp)"
        )
    per_micro_step = local_batch_size * dp_size
    if global_batch_size % per_micro_step:
        raise ValueError(
            f"training.global_batch_size={global_batch_size} is not divisible by "
            f"local_batch_size × dp = {local_batch_size} × {dp_size} = {per_micro_step}; "
            f"use a multiple of {per_micro_step}"
        )


class GlobalBatchLoader:
    """Micro-batches of one dp rank, step by step, under the layout-invariant contract above.

    `global_batch_size=-1` means local_batch_size x dp_size (no gradient accumulation).
    Iterating yields, per step, the list of this rank's micro-batches.
    """

    def __init__(
        self,
        windows_source: WindowSource,
        seq_len: int,
        global_batch_size: int,
        local_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
    ) -> None:
        if global_batch_size == -1:
            global_batch_size = local_batch_size * dp_size
        check_batch_sizes(global_batch_size, local_batch_size, dp_size)
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} is out of range for dp_size={dp_size}")
        if seq_len < 1:
            raise ValueError(f"training.seq_len={seq_len} must be at least 1")
        self.windows_source = windows_source
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.sequences_per_rank = global_batch_size // dp_size
        self.micro_batches_per_step = self.sequences_per_rank // local_batch_size
        self.step = 0  # steps already returned

    def _read_global_windows(self) -> list[np.ndarray]:
        windows = [self.windows_source.next_window() for _ in range(self.global_batch_size)]
        for window in windows:
            if window.shape != (self.seq_len + 1,):
                raise ValueError(
                    f"the window source gave a window of shape {tuple(window.shape)}, expected "
                    f"({self.seq_len + 1},) for training.seq_len={self.seq_len}; build it with "
                    "the same seq_len"
                )
        return windows

    def next_step(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next step, in order (A of them, b sequences each)."""
        # Every rank reads all G windows (tokenizing the whole stream) and keeps its slice:
        # the price of batches that do not depend on the layout.
        windows = self._read_global_windows()
        start = self.dp_rank * self.sequences_per_rank
        mine = torch.from_numpy(np.stack(windows[start : start + self.sequences_per_rank]))
        self.step += 1
        micro_batches = []
        for chunk in mine.split(self.local_batch_size):
            micro_batches.append(
                MicroBatch(inputs=chunk[:, :-1].contiguous(), labels=chunk[:, 1:].contiguous())
            )
        return micro_batches

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        while True:
            yield self.next_step()

    def state_dict(self) -> dict[str, Any]:
        """Step count, global batch and window-source state at the step boundary (equal on every rank)."""
        return {"step": self.step, "global_batch_size": self.global_batch_size,
                "windows": self.windows_source.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.windows_source.load_state_dict(state["windows"])
        saved = state.get("global_batch_size")
        if saved is not None and int(saved) != self.global_batch_size:
            logger.warning(
                "the checkpoint was trained with global batches of %d sequences, this run uses %d (local_batch_size "
                "%d x data-parallel %d x %d micro-step(s)): the data goes on where it stopped, but every step now "
                "sees another amount of it. Set training.global_batch_size=%d to keep the run as it was",
                int(saved), self.global_batch_size, self.local_batch_size, self.dp_size, self.micro_batches_per_step,
                int(saved),
            )


def build_text_loader(
    tokenizer: Tokenizer,
    dataset: str,
    path: str,
    seq_len: int,
    global_batch_size: int,
    local_batch_size: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    text_field: str = "text",
    split: str = "train",
    add_bos: bool = True,
    streaming: bool = False,
    cache_dir: str | None = None,
    synthetic_vocab_size: int = 0,
) -> GlobalBatchLoader:
    """Documents -> packed windows -> this rank's micro-batches, from config-level values.

    `dataset="synthetic"` gives random token ids below `synthetic_vocab_size` (default: the
    tokenizer's vocabulary) instead of text, for speed benchmarks.
    """
    # Validate the batch layout before opening (maybe downloading) anything.
    if global_batch_size != -1:
        check_batch_sizes(global_batch_size, local_batch_size, dp_size)
    windows: WindowSource
    if dataset == "synthetic":
        windows = SyntheticWindows(synthetic_vocab_size or tokenizer.vocab_size, seq_len)
    else:
        documents = open_documents(dataset, path, text_field, split, streaming, cache_dir)
        windows = PackedWindows(documents, tokenizer, seq_len, add_bos=add_bos)
    return GlobalBatchLoader(
        windows, seq_len, global_batch_size, local_batch_size, dp_rank=dp_rank, dp_size=dp_size
    )
