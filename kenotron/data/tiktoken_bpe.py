"""tiktoken BPE rank files: Llama 3's `tokenizer.model` format, and kenotron's built-in vocabulary.

A rank file has one line per token, `base64(token bytes) rank`, ranks 0..n-1. It does not say
how text is split into pieces before the merges run, so the split pattern comes from, in order:

1. a sidecar `<rank file>.json` holding `{"pattern": "..."}` (the built-in vocabulary ships
   one; scripts/train_tokenizer.py writes it);
2. a `tokenizer.json` of the Hugging Face repository the file sits in (its `Split`
   pre-tokenizer's regex): Llama 3 repositories keep the rank file under `original/`;
3. a file of exactly 128000 ranks is Meta's Llama 3 vocabulary, which is published without
   its pattern: Llama 3's pattern.

Any other file is refused with the fix (write the sidecar). Special tokens are not in the file
either; they are appended after the last rank:

- a file with exactly 128000 ranks gets Llama 3's 256 special tokens under their real names and
  ids (`<|begin_of_text|>` = 128000, ..., vocab_size = 128256), so token ids match
  checkpoints trained by Meta;
- any other file (kenotron's built-in 4k vocabulary included) gets the first 16 of that list,
  which keeps the chat-format names (`<|start_header_id|>`, `<|eot_id|>`, ...) at the same
  offsets from the last rank.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import tiktoken

from kenotron.data.long_documents import CUT_EXACT_PATTERNS
from kenotron.data.tokenizer import LLAMA3_SPLIT_PATTERN, Tokenizer, cpu_count
from kenotron.errors import DataError

LLAMA3_NUM_RANKS = 128_000
LLAMA3_NUM_SPECIAL_TOKENS = 256
# Special tokens appended to any vocabulary that is not Llama 3's.
SMALL_VOCAB_NUM_SPECIAL_TOKENS = 16

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"

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
        raise DataError(
            f"special token count={count} is out of range; use 2..{LLAMA3_NUM_SPECIAL_TOKENS}"
        )
    return (named + reserved)[:count]


def special_token_count_for(num_ranks: int) -> int:
    """How many special tokens a rank file of `num_ranks` entries gets appended."""
    if num_ranks == LLAMA3_NUM_RANKS:
        return LLAMA3_NUM_SPECIAL_TOKENS
    return SMALL_VOCAB_NUM_SPECIAL_TOKENS


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
                    "original/tokenizer.model, or a Hugging Face tokenizer.json"
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


def sidecar_path(rank_file: str | Path) -> Path:
    """Where the split pattern of `rank_file` is written: `<rank file>.json`."""
    rank_file = Path(rank_file)
    return rank_file.with_name(rank_file.name + ".json")


def write_sidecar(rank_file: str | Path, pattern: str) -> Path:
    """Record the split pattern a rank file was built with, beside it."""
    path = sidecar_path(rank_file)
    path.write_text(json.dumps({"pattern": pattern}, indent=1) + "\n", encoding="utf-8")
    return path


def _pattern_of_hf_json(tokenizer_json: Path) -> str | None:
    """The regex of the first `Split` pre-tokenizer of a Hugging Face tokenizer.json."""
    try:
        pre = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "Split":
            regex = (step.get("pattern") or {}).get("Regex")
            if isinstance(regex, str):
                return regex
    return None


def split_pattern_for(rank_file: Path, num_ranks: int) -> str:
    """The split pattern `rank_file` was built with (see the module docstring for the order)."""
    sidecar = sidecar_path(rank_file)
    if sidecar.is_file():
        try:
            pattern = json.loads(sidecar.read_text(encoding="utf-8"))["pattern"]
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(
                f"{str(sidecar)!r} is not a JSON object with a 'pattern' string; write "
                '{"pattern": "<the split regex>"} there'
            ) from err
        if not isinstance(pattern, str) or not pattern:
            raise DataError(f"{str(sidecar)!r}: 'pattern' must be a non-empty string")
        return pattern
    for folder in (rank_file.parent, rank_file.parent.parent):
        if (folder / "tokenizer.json").is_file():
            pattern = _pattern_of_hf_json(folder / "tokenizer.json")
            if pattern is not None:
                return pattern
    if num_ranks == LLAMA3_NUM_RANKS:
        return LLAMA3_SPLIT_PATTERN
    raise DataError(
        f"tokenizer file {str(rank_file)!r} ({num_ranks} ranks) does not say which split pattern it was built "
        f"with; write it to {str(sidecar)!r} as {{\"pattern\": \"...\"}} (kenotron's own vocabularies use "
        "Llama 3's pattern: kenotron.data.tiktoken_bpe.write_sidecar(file, LLAMA3_SPLIT_PATTERN))"
    )


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
    """A tiktoken BPE rank file with its split pattern and Llama 3's special tokens appended."""

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
        self.split_pattern = split_pattern_for(path, num_ranks)
        # tiktoken's cost stays linear and small (runs are cut above), so no length is refused.
        self.cuts_exactly = self.split_pattern in CUT_EXACT_PATTERNS
        self.vocab_size = num_ranks + len(special_names)
        self.bos_id = self.special_tokens[BEGIN_OF_TEXT]
        self.eos_id = self.special_tokens[END_OF_TEXT]
        self.threads = cpu_count()
        self._encoding = tiktoken.Encoding(
            name=self.name,
            pat_str=self.split_pattern,
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
        # tiktoken releases the GIL, so a batch runs on one thread per core; the rare texts with
        # very long runs are cut first, one by one.
        long = {i for i, t in enumerate(texts) if len(t) > _MAX_RUN_CHARS and _LONG_RUN.search(t)}
        if not long:
            return self._encoding.encode_ordinary_batch(list(texts), num_threads=self.threads)
        out = self._encoding.encode_ordinary_batch(
            ["" if i in long else t for i, t in enumerate(texts)], num_threads=self.threads
        )
        for i in long:
            out[i] = self.encode(texts[i])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(list(ids))

    def __repr__(self) -> str:
        return (
            f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )
