"""Train kenotron's built-in byte-level BPE on the built-in corpus and write the rank file.

    python scripts/train_tokenizer.py --vocab-size 4096 \
        --out kenotron/data/assets/kenotron_bpe_4k.tiktoken

(with kenotron importable: `pip install -e .`, or PYTHONPATH=. from the repository root).
--vocab-size is the total the model sees: the file gets vocab_size - 16 ranks, and the
tokenizer appends 16 special tokens when it loads the file. Training is deterministic: the
same corpus gives the same file byte for byte. The corpus is the package's snapshot of Python's
own help topics and docstrings (kenotron/data/corpus.py), the same on every Python.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

from kenotron.data.bpe_training import train_bpe, write_rank_file
from kenotron.data.corpus import builtin_documents
from kenotron.data.tiktoken_bpe import (
    SMALL_VOCAB_NUM_SPECIAL_TOKENS,
    TiktokenTokenizer,
    special_token_count_for,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=4096,
        help="total vocabulary including the 16 appended special tokens (default 4096)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("kenotron/data/assets/kenotron_bpe_4k.tiktoken"),
        help="rank file to write",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    num_ranks = args.vocab_size - SMALL_VOCAB_NUM_SPECIAL_TOKENS
    if num_ranks < 256 or special_token_count_for(num_ranks) != SMALL_VOCAB_NUM_SPECIAL_TOKENS:
        raise SystemExit(
            f"--vocab-size={args.vocab_size} gives {num_ranks} ranks; use a size of at least "
            f"{256 + SMALL_VOCAB_NUM_SPECIAL_TOKENS} (and not Llama 3's 128256)"
        )
    start = time.perf_counter()
    documents = builtin_documents()
    corpus_seconds = time.perf_counter() - start
    ranks = train_bpe(documents, num_ranks)
    write_rank_file(ranks, args.out)
    total_seconds = time.perf_counter() - start

    tokenizer = TiktokenTokenizer(args.out)
    num_tokens = sum(len(ids) for ids in tokenizer.encode_batch(documents))
    num_chars = sum(len(document) for document in documents)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(
        f"wrote {args.out} ({args.out.stat().st_size / 1024:.1f} KiB, {num_ranks} ranks, "
        f"vocab_size {tokenizer.vocab_size}, sha256 {digest[:16]})\n"
        f"corpus: {len(documents)} documents, {num_chars:,} chars, {num_tokens:,} tokens "
        f"({num_chars / num_tokens:.2f} chars/token)\n"
        f"time: {total_seconds:.1f} s ({corpus_seconds:.1f} s building the corpus)"
    )


if __name__ == "__main__":
    main()
