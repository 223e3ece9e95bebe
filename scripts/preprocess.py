"""Tokenize text once into a folder of token files (datatrove's format) that training reads directly.

    python scripts/preprocess.py --dataset jsonl --path raw/ --output tokenized/ \
        --tokenizer /path/to/Llama-3.2-1B            # a hub folder, a tiktoken file, or '' (built-in)
    python scripts/preprocess.py --dataset HuggingFaceFW/fineweb-edu --path sample-10BT \
        --output fineweb-edu-llama3/ --tokenizer /path/to/Llama-3.2-1B --workers 32

then train with `--data.dataset tokenized --data.path tokenized/` (examples/nanosets/README.md).
--dataset takes the values of data.dataset (jsonl, json, parquet, text, auto, builtin, or a hub
dataset name). Running the same command again after an interruption finishes the missing
parts only.
"""

from __future__ import annotations

import argparse
import sys

from kenotron.data.preprocess import preprocess


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="as data.dataset: jsonl, json, parquet, text, auto, "
                                                         "builtin, or a hub dataset name")
    parser.add_argument("--path", default="", help="local file or folder; for a hub dataset, its config name")
    parser.add_argument("--output", required=True, help="folder to write the token files to")
    parser.add_argument("--tokenizer", default="", help="as tokenizer.path ('' = the built-in 4k vocabulary)")
    parser.add_argument("--text-field", default="text", help="column holding the text (default: text)")
    parser.add_argument("--split", default="train", help="split of a hub dataset (default: train)")
    parser.add_argument("--no-bos", action="store_true", help="do not start documents with BOS (data.add_bos=false)")
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    parser.add_argument("--chunk-mb", type=int, default=256, help="JSON Lines files are cut into tasks of this size")
    args = parser.parse_args(argv)
    try:
        counts = preprocess(
            args.dataset, args.path, args.output, args.tokenizer, text_field=args.text_field, split=args.split,
            add_bos=not args.no_bos, workers=args.workers, chunk_bytes=args.chunk_mb << 20,
        )
    except (ValueError, FileNotFoundError, ImportError) as err:
        print(f"preprocess: {err}", file=sys.stderr)
        return 2
    print(f"{args.output}: {counts['tasks']} token files ({counts['skipped']} already done), this run "
          f"{counts['documents']:,} documents, {counts['tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
