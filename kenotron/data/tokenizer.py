"""Tokenizers: the interface the data pipeline needs, and `build_tokenizer` that picks one.

`tokenizer.path` names one of:

- "" : kenotron's built-in 4k byte-level BPE (a tiktoken rank file shipped in data/assets);
- a tiktoken BPE rank file (Llama 3's `original/tokenizer.model` format), read by
  kenotron.data.tiktoken_bpe with the split pattern it was built with;
- a Hugging Face tokenizer: a folder holding `tokenizer.json` (+ `tokenizer_config.json` for
  BOS/EOS), as on the hub, or the `tokenizer.json` file itself, read by the `tokenizers`
  library (kenotron.data.hf_tokenizer);
- a model folder without `tokenizer.json` but with `tokenizer.model` or
  `original/tokenizer.model`: that rank file.

Document text is always encoded as ordinary text: a document that contains the string
`<|end_of_text|>` gets the tokens of that string, never the control token, so data cannot
inject control tokens. BOS/EOS are added by the packer (or the preprocessor), by id.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

# Llama 3's pre-tokenizer: splits text into pieces (contractions, letter runs with one
# leading non-letter, 1-3 digit groups, punctuation runs, newline runs, whitespace) before
# BPE merges run inside each piece. The built-in vocabulary is trained with the same split.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BUILTIN_TOKENIZER_NAME = "kenotron_bpe_4k"
BUILTIN_TOKENIZER_FILE = Path(__file__).parent / "assets" / f"{BUILTIN_TOKENIZER_NAME}.tiktoken"


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


class Tokenizer(ABC):
    """What the data pipeline needs from a tokenizer.

    Attributes every implementation sets:
        name: a short label for logs and token-file metadata.
        vocab_size: number of token ids, special tokens included (ids are 0..vocab_size-1).
        bos_id: id of the begin-of-text token, or None when the tokenizer has none (Qwen).
        eos_id: id of the end-of-text token (every document ends with it).
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings encoded as ordinary text, no BOS/EOS."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (bytes that are not valid UTF-8 become U+FFFD)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts; implementations override it to use every core."""
        return [self.encode(text) for text in texts]


def _hf_file_of(candidate: Path) -> Path | None:
    if candidate.is_file() and candidate.suffix == ".json":
        return candidate
    if candidate.is_dir() and (candidate / "tokenizer.json").is_file():
        return candidate / "tokenizer.json"
    return None


def _rank_file_of(path: str, candidate: Path) -> Path:
    """The tiktoken rank file named by `path`: a file, or a model folder holding tokenizer.model."""
    if candidate.is_dir():
        # HF Llama 3 repositories keep the tiktoken file under original/.
        for inside in ("tokenizer.model", "original/tokenizer.model"):
            if (candidate / inside).is_file():
                return candidate / inside
        raise FileNotFoundError(
            f"tokenizer.path={path!r} is a folder without tokenizer.json, tokenizer.model or "
            "original/tokenizer.model; give a Hugging Face tokenizer folder, a tiktoken BPE file, "
            "or '' for the built-in tokenizer"
        )
    if not candidate.is_file():
        raise FileNotFoundError(
            f"tokenizer.path={path!r} does not exist; give a Hugging Face tokenizer folder (tokenizer.json), a "
            "tiktoken BPE rank file (e.g. Llama 3's original/tokenizer.model) or '' for the built-in 4k tokenizer"
        )
    return candidate


def build_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of `tokenizer.path` (see the module docstring for what it may name)."""
    from kenotron.data.tiktoken_bpe import TiktokenTokenizer

    if path == "":
        if not BUILTIN_TOKENIZER_FILE.is_file():
            raise FileNotFoundError(
                f"the built-in tokenizer file {str(BUILTIN_TOKENIZER_FILE)!r} is missing; "
                "reinstall kenotron or run scripts/train_tokenizer.py to rebuild it"
            )
        return TiktokenTokenizer(BUILTIN_TOKENIZER_FILE, name=BUILTIN_TOKENIZER_NAME)
    candidate = Path(path).expanduser()
    hf_file = _hf_file_of(candidate)
    if hf_file is not None:
        from kenotron.data.hf_tokenizer import HFTokenizer

        return HFTokenizer(hf_file)
    return TiktokenTokenizer(_rank_file_of(path, candidate))
