"""Hugging Face tokenizer folders for the tests, written locally from a tiktoken vocabulary.

`write_hf_tokenizer(folder)` writes kenotron's built-in 4k vocabulary as a hub-style folder
(tokenizer.json + tokenizer_config.json): the same ranks as BPE merges, the same split pattern,
the same 16 special tokens. Encoding with it through `tokenizers` must give the built-in
tiktoken tokenizer's ids, which is what the parity tests check, and datatrove (which reads only
tokenizer.json files) can tokenize with it offline.
"""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.data.tiktoken_bpe import llama3_special_tokens, read_rank_file
from kenotron.data.tokenizer import BUILTIN_TOKENIZER_FILE, LLAMA3_SPLIT_PATTERN


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def write_hf_tokenizer(
    folder: Path, rank_file: Path = BUILTIN_TOKENIZER_FILE, pattern: str = LLAMA3_SPLIT_PATTERN,
    bos: str | None = "<|begin_of_text|>", eos: str = "<|end_of_text|>", num_special: int = 16,
) -> Path:
    """A hub-style tokenizer folder with the vocabulary of `rank_file`; returns the folder."""
    ranks = read_rank_file(rank_file)
    byte_char = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        splits = [
            (token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges += [(rank, text(left), text(right)) for left, right in splits]
    merges.sort(key=lambda m: m[0])
    specials = llama3_special_tokens(num_special)
    added = [
        {"id": len(ranks) + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, name in enumerate(specials)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": vocab, "merges": [[left, right] for _, left, right in merges],
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder
