"""Tokenizers: the interface the data pipeline needs, and a tiktoken BPE implementation.

A tokenizer file is a tiktoken BPE rank file, the format of Llama 3's `tokenizer.model`: one
line per token, `base64(token bytes) rank`, ranks 0..n-1. Special tokens are not in the file;
they are appended after the last rank:

- a file with exactly 128000 ranks is taken to be Llama 3's vocabulary and gets Llama 3's 256
  special tokens under their real names and ids (`<|begin_of_text|>` = 128000, ...,
  vocab_size = 128256), so token ids match checkpoints trained by Meta;
- any other file (kenotron's built-in 4k vocabulary included) gets the first 16 of that list,
  which keeps the chat-format names (`<|start_header_id|>`, `<|eot_id|>`, ...) at the same
  offsets from the last rank.

Document text is always encoded as ordinary text: a document that contains the string
`<|end_of_text|>` gets the tokens of that string, never the control token, so data cannot
inject control tokens. BOS/EOS are added by the packer, by id.
"""

from __future__ import annotations

import base64
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

import tiktoken

from kenotron.errors import DataError

# Llama 3's pre-tokenizer: splits text into pieces (contractions, letter runs with one
# leading non-letter, 1-3 digit groups, punctuation runs, newline runs, whitespace) before
# BPE merges run inside each piece. The built-in vocabulary is trained with the same split.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_NUM_RANKS = 128_000
LLAMA3_NUM_SPECIAL_TOKENS = 256
# Special tokens appended to any vocabulary that is not Llama 3's.
SMALL_VOCAB_NUM_SPECIAL_TOKENS = 16

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"

BUILTIN_TOKENIZER_NAME = "kenotron_bpe_4k"
BUILTIN_TOKENIZER_FILE = Path(__file__).parent / "assets" / f"{BUILTIN_TOKENIZER_NAME}.tiktoken"

# tiktoken's BPE is quadratic in the length of one pre-tokenized piece; runs this long
# (minified blobs, base64, padding) are cut into chunks first. Decoding is unaffected.
_MAX_RUN_CHARS = 25_000
_LONG_RUN = re.compile(rf"\S{{{_MAX_RUN_CHARS + 1}}}|\s{{{_MAX_RUN_CHARS + 1}}}")
_RUN = re.compile(r"\S+|\s+")


def llama3_special_tokens(count: int = LLAMA3_NUM_SPECIAL_TOKENS) -> list[str]:
    """The first `count` of Llama 3.1's special tokens, in id order (offset from the last rank).

    This is the list of Meta's reference tokenizer for Llama 3.1 / 3.2 / 3.3; Llama 3.0 used the
    same ids for the tokens that matter in pretraining and chat (<|begin_of_text|>,
    <|end_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>).
    """
    named = [
        BEGIN_OF_TEXT,
        END_OF_TEXT,
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    reserved = [
        f"<|reserved_special_token_{2 + i}|>" for i in range(LLAMA3_NUM_SPECIAL_TOKENS - len(named))
    ]
    if not 2 <= count <= LLAMA3_NUM_SPECIAL_TOKENS:
        raise ValueError(
            f"special token count={count} is out of range; use 2..{LLAMA3_NUM_SPECIAL_TOKENS}"
        )
    return (named + reserved)[:count]


def special_token_count_for(num_ranks: int) -> int:
    """How many special tokens a rank file of `num_ranks` entries gets appended."""
    if num_ranks == LLAMA3_NUM_RANKS:
        return LLAMA3_NUM_SPECIAL_TOKENS
    return SMALL_VOCAB_NUM_SPECIAL_TOKENS


class Tokenizer(ABC):
    """What the data pipeline needs from a tokenizer.

    Attributes every implementation sets:
        name: a short label for logs.
        vocab_size: number of token ids, special tokens included (ids are 0..vocab_size-1).
        bos_id / eos_id: ids of the begin- and end-of-text tokens.
    """

    name: str
    vocab_size: int
    bos_id: int
    eos_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings encoded as ordinary text, no BOS/EOS."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (bytes that are not valid UTF-8 become U+FFFD)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts; implementations override it to use several threads."""
        return [self.encode(text) for text in texts]


def read_rank_file(path: str | Path) -> dict[bytes, int]:
    """Read a tiktoken BPE rank file and check it is a complete byte-level vocabulary."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                token_b64, rank_text = line.split()
                token = base64.b64decode(token_b64, validate=True)
                rank = int(rank_text)
            except ValueError as err:
                raise DataError(
                    f"tokenizer file {str(path)!r} line {line_number} is {line[:80]!r}, not "
                    "'<base64 token> <rank>'; give a tiktoken BPE rank file such as Llama 3's "
                    "original/tokenizer.model (HF tokenizer.json files are not supported)"
                ) from err
            if token in ranks:
                raise DataError(
                    f"tokenizer file {str(path)!r} line {line_number} repeats token {token!r}"
                )
            ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise DataError(
            f"tokenizer file {str(path)!r}: ranks are not exactly 0..{len(ranks) - 1}; "
            "a tiktoken rank file numbers its tokens without gaps or repeats"
        )
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise DataError(
            f"tokenizer file {str(path)!r} lacks {len(missing)} single-byte tokens "
            f"(first: {missing[0]}); a byte-level BPE needs all 256 so any text can be encoded"
        )
    return ranks


def _split_long_runs(text: str) -> Iterator[str]:
    """Cut `text` so no chunk holds more than _MAX_RUN_CHARS whitespace or non-whitespace chars."""
    chunk_start = 0
    for run in _RUN.finditer(text):
        if run.end() - run.start() <= _MAX_RUN_CHARS:
            continue
        for cut in range(run.start() + _MAX_RUN_CHARS, run.end(), _MAX_RUN_CHARS):
            yield text[chunk_start:cut]
            chunk_start = cut
    yield text[chunk_start:]


class TiktokenTokenizer(Tokenizer):
    """A tiktoken BPE rank file with Llama 3's split pattern and special tokens appended."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        path = Path(path)
        ranks = read_rank_file(path)
        num_ranks = len(ranks)
        special_names = llama3_special_tokens(special_token_count_for(num_ranks))
        self.special_tokens: dict[str, int] = {
            token: num_ranks + i for i, token in enumerate(special_names)
        }
        self.name = name or path.name
        self.path = path
        self.num_ranks = num_ranks
        self.vocab_size = num_ranks + len(special_names)
        self.bos_id = self.special_tokens[BEGIN_OF_TEXT]
        self.eos_id = self.special_tokens[END_OF_TEXT]
        self._encoding = tiktoken.Encoding(
            name=self.name,
            pat_str=LLAMA3_SPLIT_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )

    def encode(self, text: str) -> list[int]:
        # encode_ordinary ignores special tokens entirely: their strings become plain text.
        if len(text) <= _MAX_RUN_CHARS or _LONG_RUN.search(text) is None:
            return self._encoding.encode_ordinary(text)
        ids: list[int] = []
        for chunk in _split_long_runs(text):
            ids.extend(self._encoding.encode_ordinary(chunk))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # tiktoken releases the GIL, so a batch runs on several threads.
        if any(len(t) > _MAX_RUN_CHARS and _LONG_RUN.search(t) for t in texts):
            return [self.encode(text) for text in texts]
        return self._encoding.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(list(ids))

    def __repr__(self) -> str:
        return (
            f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )


def _resolve_tokenizer_file(path: str) -> Path:
    """The rank file named by `path`: a file, or a model folder holding tokenizer.model."""
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        # HF Llama 3 repositories keep the tiktoken file under original/.
        for inside in ("tokenizer.model", "original/tokenizer.model"):
            if (candidate / inside).is_file():
                return candidate / inside
        raise FileNotFoundError(
            f"tokenizer.path={path!r} is a folder without tokenizer.model or "
            "original/tokenizer.model; give the tiktoken BPE file itself, or '' for the "
            "built-in tokenizer"
        )
    if not candidate.is_file():
        raise FileNotFoundError(
            f"tokenizer.path={path!r} does not exist; give a tiktoken BPE rank file (e.g. "
            "Llama 3's original/tokenizer.model) or '' for the built-in 4k tokenizer"
        )
    return candidate


def build_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of `tokenizer.path`: "" is the built-in 4k BPE, else a tiktoken rank file."""
    if path == "":
        if not BUILTIN_TOKENIZER_FILE.is_file():
            raise FileNotFoundError(
                f"the built-in tokenizer file {str(BUILTIN_TOKENIZER_FILE)!r} is missing; "
                "reinstall kenotron or run scripts/train_tokenizer.py to rebuild it"
            )
        return TiktokenTokenizer(BUILTIN_TOKENIZER_FILE, name=BUILTIN_TOKENIZER_NAME)
    return TiktokenTokenizer(_resolve_tokenizer_file(path))
