"""Loader benchmark: tokens/s one data-parallel rank gets from each kind of source, one table.

    python scripts/bench_loader.py                              # seq 4096, dp 8, local batch 4
    python scripts/bench_loader.py --seq-len 2048 --dp 64 --repeats 8

Rank 0 of `--dp` ranks reads its share of the global batch (dp x local batch sequences per step)
through kenotron's loader, without prefetch, so the time is the loader's own work:

- tokenized (shuffled / in order): a folder in datatrove's format, memory-mapped; a rank reads
  only its own windows.
- raw jsonl: JSON Lines packed on the fly; every rank tokenizes the whole global batch's text
  (the "tokenized/s" column) to deliver its own share.
- synthetic: random ids, the floor.

The data is `--repeats` copies of the built-in corpus (kenotron.data.sample_data), written once
under `--data-dir` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from kenotron.data import (
    GlobalBatchLoader,
    NamedSource,
    PackedWindows,
    SyntheticWindows,
    TokenizedFolder,
    TokenizedWindows,
    build_tokenizer,
    open_documents,
)
from kenotron.data.sample_data import write_sample_data
from kenotron.data.tokenizer import cpu_count


def _time(loader: GlobalBatchLoader, seconds: float) -> tuple[float, int]:
    """(seconds, steps) of at least `seconds` of next_step() calls, after one warm-up step."""
    loader.next_step()
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or steps < 3:
        loader.next_step()
        steps += 1
    return elapsed, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--local-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4, help="copies of the built-in corpus (~400k tokens each)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per row")
    parser.add_argument("--data-dir", default="")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, tokenized = write_sample_data(args.data_dir or tmp, args.repeats)
        tokenizer = build_tokenizer("")
        seq, b, dp = args.seq_len, args.local_batch, args.dp
        folder = TokenizedFolder(tokenized)
        rows = {
            "tokenized, shuffled": TokenizedWindows(folder, shuffle=True, seed=0),
            "tokenized, in order": TokenizedWindows(folder, shuffle=False),
            "raw jsonl": PackedWindows(open_documents("jsonl", str(jsonl)), tokenizer, seq),
            "synthetic": SyntheticWindows(tokenizer.vocab_size),
        }
        print(f"rank 0 of dp {dp}, global batch {dp * b} x {seq} tokens; {folder.num_tokens / 1e6:.1f}M tokens of "
              f"data; {cpu_count()} cores, pid {os.getpid()}")
        print("| source | tokens/s per rank | tokenized/s per rank | ms per step |\n|---|---|---|---|")
        for name, source in rows.items():
            loader = GlobalBatchLoader(NamedSource(name, source), seq, dp * b, b, 0, dp, vocab_size=tokenizer.vocab_size)
            seconds, steps = _time(loader, args.seconds)
            mine = steps * b * seq / seconds
            tokenized_rate = steps * dp * b * seq / seconds if name == "raw jsonl" else float("nan")
            extra = f"{tokenized_rate / 1e6:.2f}M" if np.isfinite(tokenized_rate) else "-"
            print(f"| {name} | {mine / 1e6:.2f}M | {extra} | {seconds / steps * 1e3:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
