"""Tokenize text once into a folder of token files (datatrove's format): `kenotron preprocess`,
whose help this prints (kenotron/data/preprocess_cli.py).

    python scripts/preprocess.py --dataset jsonl --path raw/ --output tokenized/ \
        --tokenizer /path/to/Llama-3.2-1B            # a hub folder, a tiktoken file, or '' (built-in)
    python scripts/preprocess.py --dataset HuggingFaceFW/fineweb-edu --path sample-10BT \
        --output fineweb-edu-llama3/ --tokenizer /path/to/Llama-3.2-1B --workers 32

then train with `--data.dataset tokenized --data.path tokenized/` (examples/nanosets/README.md).
"""

import sys

from kenotron.data.preprocess_cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/preprocess.py"))
