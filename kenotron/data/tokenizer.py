"""Tokenizers: the interface the data pipeline needs (`build_tokenizer`, in tokenizer_path.py,
picks one from `tokenizer.path`).

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
    cuts_exactly: bool = False
    """Whether cutting text at the places data/long_documents.py names never changes its tokens:
    long documents are then encoded in bounded pieces."""
    max_uncut_chars: int | None = None
    """The most characters encoded in one call (a document, or a stretch without a cut place);
    longer ones are refused in one line. None: any length (the cost stays small)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings encoded as ordinary text, no BOS/EOS."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (bytes that are not valid UTF-8 become U+FFFD)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts; implementations override it to use every core."""
        return [self.encode(text) for text in texts]
