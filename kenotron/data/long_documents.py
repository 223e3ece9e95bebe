"""Long documents are tokenized in bounded pieces, with the tokens of the whole document.

A BPE tokenizer first splits text into pre-tokens by a regex and merges bytes only inside one
pre-token. For the split patterns in CUT_EXACT_PATTERNS (Llama 3's, which kenotron's built-in
vocabulary uses, and Qwen2's), no pre-token runs from a letter or digit into a following space,
nor from a newline into a following non-space character: a pre-token ending in a letter or digit
is a run of them (or a contraction), and one holding a newline ends at the last character of its
whitespace run. So cutting a text at such places gives pre-tokens, hence tokens, identical to
the whole text's, and a document of megabytes is encoded piece by piece (`PIECE_CHARS` each,
cut at the last such place before the limit) instead of in one call, whose cost in time and
memory grows with its length (Hugging Face's `tokenizers` keeps ~100 bytes per character of
one call's input; what the pieces save: docs/performance.md, "Measurements behind code choices").

A tokenizer that cannot be cut exactly (another split pattern, a normalizer that may join
characters, Metaspace) encodes each document whole, up to its `max_uncut_chars`; a longer one
stops with one line naming the document and the fix. A stretch without any cut place (a
megabyte of letters) is encoded whole under the same limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from kenotron.data.tokenizer import LLAMA3_SPLIT_PATTERN, Tokenizer
from kenotron.errors import DataError

QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CUT_EXACT_PATTERNS = frozenset({LLAMA3_SPLIT_PATTERN, QWEN2_SPLIT_PATTERN})
"""Split patterns whose pre-tokens never cross a `_CUT` place (module docstring)."""

PIECE_CHARS = 1 << 16
"""Longest piece of a long document encoded in one call (characters); cut at the last exact place before it."""
GROUP_CHARS = 1 << 20
"""Characters of pieces encoded in one batch (on every core): bounds what one call holds."""

# Between a letter or digit and a space, or between a newline and a non-whitespace character.
# ([^\W_] is a letter or digit: Python's \w less the underscore.)
_CUT = re.compile(r"(?<=[^\W_])(?= )|(?<=\n)(?=\S)")


def cut_places(text: str) -> bool:
    """Whether `text` holds a place where long documents are cut."""
    return _CUT.search(text) is not None


def pieces(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """`text` in consecutive pieces cut only at `_CUT` places, each at most `limit` characters
    unless a stretch holds no cut place (then that stretch whole)."""
    start, n = 0, len(text)
    while n - start > limit:
        cut = None
        for found in _CUT.finditer(text, start + 1, start + limit + 1):
            cut = found.start()  # the last place within the limit
        if cut is None:
            found = _CUT.search(text, start + limit + 1)
            if found is None:
                break
            cut = found.start()
        yield text[start:cut]
        start = cut
    yield text[start:]


def check_encodable(tokenizer: Tokenizer, text: str, where: str) -> None:
    """DataError in one line when `tokenizer` would have to encode more than its
    max_uncut_chars of `text` (the document `where`) in one call."""
    limit = tokenizer.max_uncut_chars
    if limit is None or len(text) <= limit:
        return
    longest = max(map(len, pieces(text))) if tokenizer.cuts_exactly else len(text)
    if longest > limit:
        how = ("has a stretch of" if tokenizer.cuts_exactly else "is")
        raise DataError(
            f"{where} {how} {longest:,} characters that {tokenizer.name} must tokenize in one piece, more than the "
            f"{limit:,} it takes at once (time and memory grow with it); split that document into several records"
        )


def encode_documents(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """`tokenizer.encode_batch(texts)`, with documents longer than PIECE_CHARS encoded in pieces
    when the tokenizer cuts exactly (the same tokens, bounded memory)."""
    if not tokenizer.cuts_exactly or all(len(t) <= PIECE_CHARS for t in texts):
        return tokenizer.encode_batch(texts)
    long = [i for i, t in enumerate(texts) if len(t) > PIECE_CHARS]
    out = tokenizer.encode_batch(["" if len(t) > PIECE_CHARS else t for t in texts])
    for i in long:
        out[i] = _encode_in_pieces(tokenizer, texts[i])
    return out


def _encode_in_pieces(tokenizer: Tokenizer, text: str) -> list[int]:
    ids: list[int] = []
    group: list[str] = []
    size = 0
    for piece in pieces(text):
        group.append(piece)
        size += len(piece)
        if size >= GROUP_CHARS:
            for piece_ids in tokenizer.encode_batch(group):
                ids.extend(piece_ids)
            group, size = [], 0
    for piece_ids in tokenizer.encode_batch(group):
        ids.extend(piece_ids)
    return ids
