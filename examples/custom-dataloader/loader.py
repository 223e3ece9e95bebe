"""A custom data loader for kenotron: token ids from one NumPy file, cut into windows.

Use it with

    ./run_train.sh --config examples/custom-dataloader/config.toml

or point `data.loader` at it from any config: `data.loader = "examples/custom-dataloader/loader.py:build"`.
`data.path` names a `.npy` file of token ids (any integer dtype); empty, the loader tokenizes
kenotron's built-in corpus in memory, so the example runs with nothing to download.

What kenotron asks of a loader (kenotron/data/custom.py has the full protocol):
- `next_step()` returns this dp rank's micro-batches of the next optimizer step;
- `state_dict()` / `load_state_dict()` save and restore its position, the same on every rank.
"""

from __future__ import annotations

import numpy as np
import torch

from kenotron.data import LoaderContext, MicroBatch, builtin_documents


class NumpyTokenLoader:
    """Window k of the file is tokens [k*(L+1), (k+1)*(L+1)), L = seq_len; step s uses windows
    [s*G, (s+1)*G) and dp rank r of D takes the r-th slice of G/D of them, so the global batch does
    not depend on D. The whole state is the step count."""

    def __init__(self, tokens: np.ndarray, ctx: LoaderContext) -> None:
        self.tokens = tokens
        self.ctx = ctx
        self.window = ctx.seq_len + 1
        self.num_windows = len(tokens) // self.window
        if self.num_windows == 0:
            raise ValueError(f"the token file holds {len(tokens)} tokens, fewer than one window of {self.window}")
        self.step = 0

    def next_step(self) -> list[MicroBatch]:
        ctx = self.ctx
        per_rank = ctx.global_batch_size // ctx.dp_size
        first = self.step * ctx.global_batch_size + ctx.dp_rank * per_rank
        self.step += 1
        if not (ctx.feed_inputs or ctx.feed_labels):  # a middle pipeline stage: nothing to read
            return [MicroBatch(None, None) for _ in range(ctx.micro_batches_per_step)]
        rows = [(first + i) % self.num_windows for i in range(per_rank)]  # wraps around: epochs
        batch = torch.from_numpy(
            np.stack([self.tokens[k * self.window : (k + 1) * self.window] for k in rows]).astype(np.int64)
        )
        return [
            MicroBatch(
                inputs=chunk[:, :-1].contiguous() if ctx.feed_inputs else None,
                labels=chunk[:, 1:].contiguous() if ctx.feed_labels else None,
            )
            for chunk in batch.split(ctx.local_batch_size)
        ]

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def build(ctx: LoaderContext) -> NumpyTokenLoader:
    """The builder `data.loader` names: called once per rank with the job's context."""
    path = ctx.cfg.data.path
    if path:
        tokens = np.load(path, mmap_mode="r")
    else:
        tokenizer = ctx.tokenizer
        ids = tokenizer.encode_batch(builtin_documents())
        tokens = np.concatenate([np.array(doc + [tokenizer.eos_id], dtype=np.int32) for doc in ids])
    return NumpyTokenLoader(tokens, ctx)
