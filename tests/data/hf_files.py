"""Hugging Face tokenizer folders for the tests, written locally from kenotron's built-in vocabulary.

`write_hf_tokenizer(folder)` writes the built-in 4k BPE as a hub-style folder (tokenizer.json +
tokenizer_config.json) with kenotron's own converter (kenotron.checkpoint.hf_tokenizer, the
`to-hf` export): the same ranks as BPE merges, the same split pattern, the same special tokens.
Encoding with it through `tokenizers` must give the tiktoken tokenizer's ids, which is what the
parity tests check, and datatrove (which reads tokenizer.json files) can tokenize with it offline.
"""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.checkpoint.hf_tokenizer import tiktoken_to_tokenizer_json
from kenotron.data.tokenizer_path import build_tokenizer


def write_hf_tokenizer(folder: Path, pattern: str | None = None, bos: str | None = "<|begin_of_text|>",
                       eos: str = "<|end_of_text|>") -> Path:
    """A hub-style folder of the built-in vocabulary (optionally with another split `pattern` and
    other BOS/EOS names in its tokenizer_config.json); returns the folder."""
    tokenizer = json.loads(tiktoken_to_tokenizer_json(build_tokenizer("")))
    if pattern is not None:
        tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder
