"""Hugging Face tokenizers: a `tokenizer.json` (+ `tokenizer_config.json`) read by `tokenizers`.

A hub model folder holds `tokenizer.json` (the vocabulary, merges, split pattern, normalizer and
added tokens) and `tokenizer_config.json` (which added tokens are BOS and EOS). Both are read
as they are, so Qwen, Mistral and StarCoder2 checkpoints train on their own tokenization:

- BOS / EOS: `bos_token` / `eos_token` of tokenizer_config.json (a string or an
  `{"content": ...}` object). A tokenizer without BOS (Qwen's `bos_token: null`) has
  bos_id None, and documents then start without one. Without tokenizer_config.json, EOS is
  taken from the usual names (`</s>`, `<|endoftext|>`, `<|end_of_text|>`) when exactly one
  of them exists.
- The tokenizer's own post-processor (which adds BOS on Llama-style tokenizers) is not applied:
  kenotron adds BOS/EOS by id, as for every tokenizer.
- Special-token strings inside a document are encoded as plain text (the library's
  `encode_special_tokens`), so data cannot inject control tokens.
- Batches are encoded by the library's thread pool over every core.
- A long document is encoded in pieces when the tokenizer is cut exactly there (a byte-level
  BPE behind Llama 3's or Qwen2's split pattern, no normalizer but NFC: data/long_documents.py);
  otherwise whole, up to MAX_UNCUT_CHARS characters (one call keeps ~100 bytes per character).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kenotron.data.long_documents import CUT_EXACT_PATTERNS, cut_places
from kenotron.data.tokenizer import Tokenizer
from kenotron.errors import DataError

_EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>")
MAX_UNCUT_CHARS = 4 << 20
"""The most characters encoded in one call (its cost in `tokenizers`: docs/performance.md)."""


def cuts_exactly(tokenizer_json: dict[str, Any]) -> bool:
    """Whether a tokenizer.json's tokens never change when its input is cut at long_documents'
    places: no normalizer but NFC (which joins only combining marks to what precedes them),
    Split by a pattern of CUT_EXACT_PATTERNS then ByteLevel without its own regex or prefix
    space, a BPE without dropout, and no added token that holds a cut place or strips spaces."""
    normalizer = tokenizer_json.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return False
    split, byte_level = steps
    if (split.get("type") != "Split" or (split.get("pattern") or {}).get("Regex") not in CUT_EXACT_PATTERNS
            or split.get("behavior") != "Isolated" or split.get("invert")):
        return False
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        return False
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return False
    return not any(not t.get("special") and (cut_places(t.get("content", "")) or t.get("rstrip") or t.get("lstrip"))
                   for t in tokenizer_json.get("added_tokens") or [])


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` from a tokenizer.json, with BOS/EOS from tokenizer_config.json."""

    def __init__(self, tokenizer_json: str | Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer  # the tokenizers package is loaded when a tokenizer.json is read

        path = Path(tokenizer_json)
        try:
            self._tokenizer = _Tokenizer.from_file(str(path))
        except Exception as err:
            raise DataError(
                f"tokenizer.path: {str(path)!r} is not a Hugging Face tokenizer.json the `tokenizers` library can read "
                f"({err}); give the tokenizer.json of a hub model folder, or a tiktoken rank file"
            ) from err
        self._tokenizer.encode_special_tokens = True
        self.cuts_exactly = cuts_exactly(json.loads(self._tokenizer.to_str()))
        self.max_uncut_chars = MAX_UNCUT_CHARS
        self.path = path
        self.name = path.parent.name or path.name
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        config_path = path.with_name("tokenizer_config.json")
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except ValueError as err:
                raise DataError(f"{str(config_path)!r} is not valid JSON ({err})") from err
        self.bos_id = self._special_id("bos_token", _token_text(config.get("bos_token")), config_path)
        eos_text = _token_text(config.get("eos_token"))
        if eos_text is None and not config:
            found = [name for name in _EOS_NAMES if name in vocab]
            eos_text = found[0] if len(found) == 1 else None
        eos_id = self._special_id("eos_token", eos_text, config_path)
        if eos_id is None:
            raise DataError(
                f"the tokenizer at {str(path.parent)!r} names no EOS token: every document ends with one; put "
                f"tokenizer_config.json (with \"eos_token\") beside {path.name}, as in the model's hub folder"
            )
        self.eos_id = eos_id

    def _special_id(self, key: str, text: str | None, config_path: Path) -> int | None:
        if text is None:
            return None
        token_id = self._tokenizer.token_to_id(text)
        if token_id is None:
            raise DataError(
                f"{str(config_path)!r}: {key}={text!r} is not a token of {self.path.name}; "
                "the two files come from different tokenizers"
            )
        return token_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets kenotron does not use.
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        encodings = encode(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )
