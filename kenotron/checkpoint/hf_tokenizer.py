"""The tokenizer files of a Hugging Face folder written by kenotron (`to-hf`).

For a tiktoken BPE (kenotron's built-in one, Llama 3's `tokenizer.model`, ...) the folder gets:

- `tokenizer.model`: the rank file itself (kenotron reads the folder through tokenizer.json, the
  same ids, or this file when tokenizer.path names it);
- `tokenizer.json`: the same BPE for the `tokenizers` package and transformers'
  PreTrainedTokenizerFast (byte-level BPE, the same split pattern, the special tokens at the same
  ids, BOS added in front as Llama 3's does); needs the `tokenizers` package;
- `tokenizer_config.json` and `special_tokens_map.json`: the BOS/EOS names for transformers;
- `generation_config.json`: BOS/EOS ids, so `generate()` stops at the end of a text.

A tokenizer kind other than tiktoken adds its own writer to WRITERS.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.data.tiktoken_bpe import BEGIN_OF_TEXT, END_OF_TEXT, TiktokenTokenizer, read_rank_file

logger = logging.getLogger("kenotron")

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_JSON = "tokenizer.json"
TIKTOKEN_FILE = "tokenizer.model"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """tiktoken ranks -> the vocabulary and ordered merges of an equivalent byte-level BPE.

    tiktoken merges the adjacent pair whose merged token has the lowest rank; a BPE with the
    merges ordered by the merged token's rank does the same.
    """
    alphabet = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    return vocab, [(left, right) for *_, left, right in merges]


def tiktoken_to_tokenizer_json(tokenizer: TiktokenTokenizer) -> str:
    """tokenizer.json text for a kenotron tiktoken tokenizer (needs the `tokenizers` package)."""
    try:
        from tokenizers import (  # optional package (the hf extra): only tokenizer.json needs it
            AddedToken,
            Regex,
            decoders,
            models,
            pre_tokenizers,
            processors,
        )
        from tokenizers import Tokenizer as HFTokenizer  # optional package, as above
    except ImportError:
        raise CheckpointFormatError(
            "writing tokenizer.json needs the tokenizers package: pip install 'kenotron[hf]'"
        ) from None
    vocab, merges = bpe_vocab_and_merges(read_rank_file(tokenizer.path))
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokenizer.split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1])
    hf.add_special_tokens([AddedToken(name, special=True, normalized=False) for name, _ in specials])
    assert hf.token_to_id(BEGIN_OF_TEXT) == tokenizer.bos_id, "special tokens must keep their ids"
    hf.post_processor = processors.TemplateProcessing(
        single=f"{BEGIN_OF_TEXT} $A", pair=f"{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT} $B",
        special_tokens=[(BEGIN_OF_TEXT, tokenizer.bos_id)],
    )
    return hf.to_str()


def _write_tiktoken(tokenizer: TiktokenTokenizer, out: Path) -> list[str]:
    shutil.copyfile(tokenizer.path, out / TIKTOKEN_FILE)
    written = [TIKTOKEN_FILE]
    try:
        (out / TOKENIZER_JSON).write_text(tiktoken_to_tokenizer_json(tokenizer))
        written.append(TOKENIZER_JSON)
    except CheckpointFormatError as exc:
        logger.warning("%s; the folder has %s only (kenotron reads it)", exc, TIKTOKEN_FILE)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BEGIN_OF_TEXT, "eos_token": END_OF_TEXT,
        "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BEGIN_OF_TEXT, "eos_token": END_OF_TEXT}, indent=2) + "\n")
    return [*written, "tokenizer_config.json", "special_tokens_map.json"]


WRITERS: dict[type, Callable[[Any, Path], list[str]]] = {TiktokenTokenizer: _write_tiktoken}
"""Tokenizer class -> function writing its files into an HF folder (returns their names)."""


def write_hf_tokenizer(tokenizer: Any, out_dir: str | Path) -> list[str]:
    """The tokenizer's files and generation_config.json (BOS/EOS) in `out_dir`; their names."""
    out = Path(out_dir)
    writer = WRITERS.get(type(tokenizer))
    if writer is None:
        raise CheckpointFormatError(f"no Hugging Face export for tokenizer {type(tokenizer).__name__}")
    written = writer(tokenizer, out)
    generation = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "do_sample": False}
    (out / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    return [*written, GENERATION_CONFIG]
