"""`kenotron preprocess`: tokenize text once into a folder of token files (datatrove's format)
that training reads directly.

    kenotron preprocess --dataset jsonl --path raw/ --output tokenized/ \
        --tokenizer /path/to/Llama-3.2-1B            # a hub folder, a tiktoken file, or '' (built-in)
    kenotron preprocess --dataset HuggingFaceFW/fineweb-edu --path sample-10BT \
        --output fineweb-edu-llama3/ --tokenizer /path/to/Llama-3.2-1B --workers 32

then train with `--data.dataset tokenized --data.path tokenized/` (examples/nanosets/README.md).
--dataset takes the values of data.dataset (jsonl, json, parquet, text, auto, builtin, or a hub
dataset name). Running the same command again after an interruption finishes the missing
parts only. In a clone, `python scripts/preprocess.py` is the same command.
"""

from __future__ import annotations

import argparse
import sys

from kenotron.data.preprocess import preprocess


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--dataset", required=True, help="as data.dataset: jsonl, json, parquet, text, auto, "
                                                    "builtin, or a hub dataset name")
    p.add_argument("--path", default="", help="local file or folder; for a hub dataset, its config name")
    p.add_argument("--output", required=True, help="folder to write the token files to")
    p.add_argument("--tokenizer", default="", help="as tokenizer.path ('' = the built-in 4k vocabulary)")
    p.add_argument("--text-field", default="text", help="column holding the text (default: text)")
    p.add_argument("--split", default="train", help="split of a hub dataset (default: train)")
    p.add_argument("--no-bos", action="store_true", help="do not start documents with BOS (data.add_bos=false)")
    p.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    p.add_argument("--chunk-mb", type=int, default=256, help="JSON Lines files are cut into tasks of this size")
    return p


def main(argv: list[str] | None = None, prog: str = "kenotron preprocess") -> int:
    args = parser(prog).parse_args(argv)
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
