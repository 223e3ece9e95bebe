"""Sample data written from the built-in corpus: a raw JSON Lines file and its tokenized folder.

For benchmarks and examples that need real files but no download:

    jsonl, tokenized = write_sample_data("bench-data/", repeats=4)

`repeats` copies of the built-in corpus (about 400k tokens each with the built-in tokenizer)
go into `corpus.jsonl`, which `tokenized/` holds tokenized (kenotron.data.preprocess).
Both are reused when they already exist.
"""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.data.corpus import builtin_documents
from kenotron.data.preprocess import preprocess


def write_sample_data(folder: str | Path, repeats: int = 1, tokenizer_path: str = "",
                      workers: int = 0) -> tuple[Path, Path]:
    """(jsonl file, tokenized folder) of `repeats` copies of the built-in corpus under `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = folder / "corpus.jsonl"
    if not jsonl.is_file():
        part = jsonl.with_name(jsonl.name + ".part")
        with open(part, "w", encoding="utf-8") as f:
            for copy in range(repeats):
                f.writelines(json.dumps({"id": f"{copy}-{i}", "text": text}) + "\n" for i, text in enumerate(builtin_documents()))
        part.replace(jsonl)
    tokenized = folder / "tokenized"
    preprocess("jsonl", str(jsonl), tokenized, tokenizer_path, workers=workers, chunk_bytes=32 << 20, progress=False)
    return jsonl, tokenized
