"""The data loader: global batches that do not depend on the parallel layout.

Contract: the global batch of step s is the same set of sequences whatever the data-parallel
degree D and the micro-batch size b. With G = global_batch_size:

- step s is samples [s*G, (s+1)*G) of the run; the blend (kenotron.data.blend) says which
  dataset each sample comes from, and each dataset gives its samples in its own order
  (shuffled windows for tokenized folders, the packed stream for raw text);
- dp rank r takes the contiguous slice [r*G/D, (r+1)*G/D) of the step's samples,
- and splits it, in order, into A = G/(D*b) micro-batches of b sequences (gradient
  accumulation steps).

So a run on 8 GPUs and its replay on 1 GPU with 8x accumulation see the same data, and a
checkpoint taken under one layout resumes under another.

Each rank reads only its own windows from random-access datasets (tokenized folders): the
loader's counters say which windows of the dataset the step uses. A sequential dataset (raw text
packed on the fly) must be read in order, so every rank tokenizes the step's windows of it and
builds only its own; for large data-parallel degrees, tokenize ahead with `kenotron preprocess`.

State: the step count, the data stage and its interleaving counters, how many windows each
dataset has given, the tokens each dataset has given, and each sequential dataset's position.
It is O(number of datasets), identical on every rank, and resuming reads nothing twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kenotron.data.blend import Interleaver, Stage, check_stages, stage_index
from kenotron.data.sources import is_random_access
from kenotron.errors import DataError

logger = logging.getLogger("kenotron")


@dataclass
class MicroBatch:
    """b sequences: `inputs` and `labels` (inputs shifted by one), int64 [b, seq_len] on CPU.

    A pipeline stage that needs no inputs (or no labels) gets None there.
    """

    inputs: torch.Tensor | None
    labels: torch.Tensor | None
    domains: torch.Tensor | None = None
    """The blend's dataset index of each sequence, int64 [b] (kenotron's loader; None from custom loaders)."""


@dataclass
class NamedSource:
    """One dataset of a blend: a label for metrics and its windows (see kenotron.data.sources)."""

    name: str
    source: Any


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

    `sources`: one window source, or NamedSources blended by `stages` (default: one stage from
    step 0, equal weights, `seq_len`). `global_batch_size=-1` means local_batch_size x dp_size.
    `vocab_size`: token ids from random-access datasets are checked to be below it.
    Iterating yields, per step, the list of this rank's micro-batches.
    """

    def __init__(
        self,
        sources: Any,
        seq_len: int,
        global_batch_size: int,
        local_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        *,
        stages: Sequence[Stage] | None = None,
        feed_inputs: bool = True,
        feed_labels: bool = True,
        vocab_size: int | None = None,
    ) -> None:
        if global_batch_size == -1:
            global_batch_size = local_batch_size * dp_size
        check_batch_sizes(global_batch_size, local_batch_size, dp_size)
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} is out of range for dp_size={dp_size}")
        if seq_len < 1:
            raise ValueError(f"training.seq_len={seq_len} must be at least 1")
        if isinstance(sources, NamedSource):
            sources = [sources]
        elif not isinstance(sources, (list, tuple)):
            sources = [NamedSource(getattr(sources, "name", "data"), sources)]
        self.sources: list[NamedSource] = list(sources)
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names {names} repeat; give each data source its own name")
        self.stages = list(stages or [Stage(0, tuple(1 / len(names) for _ in names), seq_len)])
        check_stages(self.stages)
        for stage in self.stages:
            if len(stage.weights) != len(self.sources):
                raise ValueError(f"a data stage has {len(stage.weights)} weights for {len(self.sources)} datasets")
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.feed_inputs, self.feed_labels = feed_inputs, feed_labels
        self.vocab_size = vocab_size
        self.sequences_per_rank = global_batch_size // dp_size
        self.micro_batches_per_step = self.sequences_per_rank // local_batch_size
        self.step = 0  # steps already returned
        self.windows_drawn = [0] * len(self.sources)  # per dataset, counted in windows of `window_len`
        self.tokens_seen = [0] * len(self.sources)  # label tokens each dataset has given, all ranks
        self._stage = -1
        self._interleaver = Interleaver(self.stages[0].weights)
        self._window_len = self.stages[0].seq_len + 1
        self.last_seq_len: int | None = None  # of the last step returned

    # -- stages -------------------------------------------------------------------------------

    def _enter_stage(self, index: int) -> None:
        """Start stage `index`: a fresh interleaving; dataset positions carry over (in windows of the new length)."""
        stage = self.stages[index]
        self._set_window_len(stage.seq_len + 1)
        self._interleaver = Interleaver(stage.weights)
        self._stage = index

    def _set_window_len(self, window_len: int) -> None:
        # The same fraction of each random-access dataset counts as used; sequential streams
        # continue at the exact token where they stopped.
        if window_len != self._window_len:
            self.windows_drawn = [math.ceil(n * self._window_len / window_len) for n in self.windows_drawn]
            self._window_len = window_len
        for named in self.sources:
            if not is_random_access(named.source) and hasattr(named.source, "seq_len"):
                named.source.seq_len = window_len - 1

    # -- one step -----------------------------------------------------------------------------

    def _check_ids(self, windows: np.ndarray, named: NamedSource) -> None:
        if self.vocab_size is None or not windows.size:
            return
        top = int(windows.max())
        if top >= self.vocab_size or int(windows.min()) < 0:
            folder = getattr(getattr(named.source, "folder", None), "folder", None)
            where = f" ({folder})" if folder is not None else ""
            raise DataError(
                f"dataset {named.name!r}{where} holds token id {top}, beyond the model's vocabulary of "
                f"{self.vocab_size}: it was tokenized with another tokenizer; re-tokenize it with tokenizer.path's "
                f"tokenizer (`kenotron preprocess`), or set model.vocab_size above {top}"
            )

    def next_step(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next step, in order (A of them, b sequences each)."""
        index = stage_index(self.stages, self.step)
        if index != self._stage:
            self._enter_stage(index)
        window_len = self._window_len
        choice = self._interleaver.next(self.global_batch_size)
        lo = self.dp_rank * self.sequences_per_rank
        hi = lo + self.sequences_per_rank
        fed = self.feed_inputs or self.feed_labels
        batch = np.empty((self.sequences_per_rank, window_len), dtype=np.int64) if fed else None
        for d, named in enumerate(self.sources):
            positions = np.flatnonzero(choice == d)  # this dataset's samples in the global batch
            if not len(positions):
                continue
            mine = (positions >= lo) & (positions < hi)
            if is_random_access(named.source):
                if batch is not None and mine.any():
                    indices = self.windows_drawn[d] + np.flatnonzero(mine)
                    windows = named.source.windows(indices, window_len)
                    self._check_ids(windows, named)
                    batch[positions[mine] - lo] = windows
            else:
                skip = getattr(named.source, "skip_window", named.source.next_window)
                for position, keep in zip(positions.tolist(), mine.tolist(), strict=True):
                    if keep and batch is not None:
                        window = named.source.next_window()
                        if window.shape != (window_len,):
                            raise ValueError(
                                f"dataset {named.name!r} gave a window of shape {tuple(window.shape)}, expected "
                                f"({window_len},) for seq_len={window_len - 1}; build it with the same seq_len"
                            )
                        batch[position - lo] = window
                    else:
                        skip()
            self.windows_drawn[d] += len(positions)
            self.tokens_seen[d] += len(positions) * (window_len - 1)
        self.step += 1
        self.last_seq_len = window_len - 1
        return self._micro_batches(batch, torch.from_numpy(choice[lo:hi].copy()))

    def _micro_batches(self, batch: np.ndarray | None, domains: torch.Tensor) -> list[MicroBatch]:
        parts = domains.split(self.local_batch_size)
        if batch is None:
            return [MicroBatch(None, None, d) for d in parts]
        mine = torch.from_numpy(batch)
        out = []
        for chunk, d in zip(mine.split(self.local_batch_size), parts, strict=True):
            inputs = chunk[:, :-1].contiguous() if self.feed_inputs else None
            labels = chunk[:, 1:].contiguous() if self.feed_labels else None
            out.append(MicroBatch(inputs=inputs, labels=labels, domains=d))
        return out

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        while True:
            yield self.next_step()

    def tokens_by_dataset(self) -> dict[str, int]:
        """Label tokens each dataset has given so far, over all ranks."""
        return {named.name: n for named, n in zip(self.sources, self.tokens_seen, strict=True)}

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands in its data (equal on every rank)."""
        return {
            "step": self.step,
            "global_batch_size": self.global_batch_size,
            "stage_start": self.stages[self._stage].start_step if self._stage >= 0 else None,
            "interleaver": self._interleaver.state_dict(),
            "window_len": self._window_len,
            "windows_drawn": list(self.windows_drawn),
            "tokens_seen": self.tokens_by_dataset(),
            "sequential": {
                named.name: named.source.state_dict()
                for named in self.sources
                if not is_random_access(named.source)
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "windows_drawn" not in state:
            raise DataError(
                "the checkpoint's data position was saved by an older kenotron (before blends and tokenized data); "
                "resume with --checkpoint.exclude_from_loading dataloader (the data restarts from its beginning)"
            )
        names = [named.name for named in self.sources]
        if sorted(state["tokens_seen"]) != sorted(names):
            raise DataError(
                f"the checkpoint's data comes from datasets {sorted(state['tokens_seen'])}, this run's from "
                f"{sorted(names)}; resume with the same data sources (or exclude 'dataloader' from loading)"
            )
        self.step = int(state["step"])
        saved = state.get("global_batch_size")
        if saved is not None and int(saved) != self.global_batch_size:
            logger.warning(
                "the checkpoint was trained with global batches of %d sequences, this run uses %d (local_batch_size "
                "%d x data-parallel %d x %d micro-step(s)): the data goes on where it stopped, but every step now "
                "sees another amount of it. Set training.global_batch_size=%d to keep the run as it was",
                int(saved), self.global_batch_size, self.local_batch_size, self.dp_size, self.micro_batches_per_step,
                int(saved),
            )
        self.windows_drawn = [int(n) for n in state["windows_drawn"]]
        self.tokens_seen = [int(state["tokens_seen"][name]) for name in names]
        self._window_len = int(state["window_len"])
        for named in self.sources:
            if not is_random_access(named.source):
                named.source.load_state_dict(state["sequential"][named.name])
        index = stage_index(self.stages, self.step)
        if state["stage_start"] is not None and self.stages[index].start_step == state["stage_start"]:
            # Mid-stage: continue its interleaving where it stopped.
            self._enter_stage(index)
            self._interleaver.load_state_dict(state["interleaver"])
        else:
            self._stage = -1  # next_step enters the stage this step belongs to
