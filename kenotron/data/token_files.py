"""Pre-tokenized data in datatrove's format (the files nanotron's Nanosets read).

A tokenized folder holds one or more token files, each with two companions:

    <name>.ds            token ids, little-endian uint16 (vocabularies up to 65536) or uint32
    <name>.ds.index      where each document ends, in tokens: little-endian uint64, one per document
    <name>.ds.metadata   three text lines: "<tokenizer name>|<bytes per token>", the token count,
                         and the count in words ("1.2 GT")

datatrove's `DocumentTokenizer` writes exactly this (with or without its document shuffle),
and so does `kenotron preprocess`. The folder's files, sorted by path, are read as one stream of
tokens; a window of the stream is a memory-mapped slice, so any window is O(1) to reach.

Every file is checked when opened, before training starts: the token file must be a whole
number of tokens, its index must end exactly at its last token and never go backwards, and the
metadata (when present) must agree with both. A file with neither index nor metadata is not
taken as token data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kenotron.errors import DataError

TOKEN_SUFFIX = ".ds"
INDEX_SUFFIX = ".ds.index"
METADATA_SUFFIX = ".ds.metadata"
TOKEN_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class TokenFileError(DataError):
    """A token file, its index or its metadata is missing, truncated or inconsistent."""


def token_size_for(vocab_size: int) -> int:
    """Bytes per token datatrove uses for a vocabulary: 2 up to 65536 ids, else 4."""
    return 2 if vocab_size <= 2**16 else 4


def _read_metadata(path: Path) -> tuple[str, int, int]:
    """(tokenizer name, bytes per token, token count) of a .ds.metadata file."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        name, _, size_text = lines[0].rpartition("|")
        token_size, count = int(size_text), int(lines[1])
    except (IndexError, ValueError):
        raise TokenFileError(
            f"{str(path)!r} is not datatrove token metadata (expected '<tokenizer>|<bytes per token>' then the "
            f"token count); rewrite the folder with kenotron preprocess or datatrove's DocumentTokenizer"
        ) from None
    if token_size not in TOKEN_DTYPES:
        raise TokenFileError(f"{str(path)!r} says {token_size} bytes per token; datatrove writes 2 or 4")
    return name, token_size, count


@dataclass
class TokenFile:
    """One checked token file: its size, dtype and (lazily mapped) tokens."""

    path: Path
    token_size: int
    num_tokens: int
    num_documents: int | None
    tokenizer_name: str

    def __post_init__(self) -> None:
        self._tokens: np.memmap | None = None

    @property
    def tokens(self) -> np.ndarray:
        """The file's token ids, memory-mapped (read-only)."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=TOKEN_DTYPES[self.token_size], mode="r")
        return self._tokens

    def document_ends(self) -> np.ndarray:
        """Where each document ends, in tokens (uint64); needs the .index file."""
        return np.fromfile(self.path.with_name(self.path.name + ".index"), dtype="<u8")


def open_token_file(path: str | Path) -> TokenFile:
    """Check a token file against its index and metadata; raise TokenFileError naming the problem."""
    path = Path(path)
    index_path = path.with_name(path.name + ".index")
    metadata_path = path.with_name(path.name + ".metadata")
    size = path.stat().st_size
    has_index, has_metadata = index_path.is_file(), metadata_path.is_file()
    if not has_index and not has_metadata:
        raise TokenFileError(
            f"{str(path)!r} has neither {index_path.name} nor {metadata_path.name} beside it, so it is not a datatrove "
            "token file; write tokenized data with kenotron preprocess (or datatrove's DocumentTokenizer)"
        )
    name, token_size, meta_count = _read_metadata(metadata_path) if has_metadata else ("", 0, -1)
    ends = None
    if has_index:
        index_size = index_path.stat().st_size
        if index_size % 8:
            raise TokenFileError(
                f"{str(index_path)!r} holds {index_size} bytes, not a whole number of uint64 document ends: it is "
                "truncated; re-run the tokenization of this file"
            )
        ends = np.fromfile(index_path, dtype="<u8")
        if len(ends) and np.any(ends[1:] < ends[:-1]):
            raise TokenFileError(f"{str(index_path)!r} goes backwards, so it is not the index of {path.name}")
        if not token_size:  # no metadata: the index says how many tokens the file holds
            last = int(ends[-1]) if len(ends) else 0
            token_size = 2 if last == size == 0 else size // last if last and size % last == 0 else 0
            if token_size not in TOKEN_DTYPES:
                raise TokenFileError(
                    f"{str(path)!r} holds {size} bytes but its index ends at token {last}: the index does not "
                    f"match its token file (truncated or foreign); re-run the tokenization of this file"
                )
    if size % token_size:
        raise TokenFileError(
            f"{str(path)!r} holds {size} bytes, not a whole number of {token_size}-byte tokens: it is truncated; "
            "re-run the tokenization of this file"
        )
    num_tokens = size // token_size
    if has_metadata and meta_count != num_tokens:
        raise TokenFileError(
            f"{str(path)!r} holds {num_tokens} tokens but {metadata_path.name} says {meta_count}: the file is "
            "truncated or was replaced; re-run the tokenization of this file"
        )
    if ends is not None and (int(ends[-1]) if len(ends) else 0) != num_tokens:
        raise TokenFileError(
            f"{str(index_path)!r} ends at token {int(ends[-1]) if len(ends) else 0} but {path.name} holds "
            f"{num_tokens} tokens: the index does not match its token file; re-run the tokenization of this file"
        )
    return TokenFile(path, token_size, num_tokens, None if ends is None else len(ends), name)


def token_files_in(folder: str | Path) -> list[Path]:
    """The .ds files under `folder` (recursively, hidden folders skipped), sorted by path."""
    root = Path(folder).expanduser()
    if root.is_file() and root.name.endswith(TOKEN_SUFFIX):
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(
            f"tokenized data folder {str(folder)!r} does not exist; write one with kenotron preprocess"
        )
    files = sorted(
        f for f in root.rglob(f"*{TOKEN_SUFFIX}")
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)
    )
    if not files:
        raise FileNotFoundError(
            f"{str(folder)!r} holds no {TOKEN_SUFFIX} token files; write them with kenotron preprocess (or "
            "datatrove's DocumentTokenizer), or point the path at the folder that has them"
        )
    return files


class TokenizedFolder:
    """The token files of a folder read as one stream: O(1) slices by memory map."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.files = [open_token_file(f) for f in token_files_in(folder)]
        sizes = np.array([f.num_tokens for f in self.files], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])
        self.num_tokens = int(self.starts[-1])
        self.token_size = max(f.token_size for f in self.files)
        names = sorted({f.tokenizer_name for f in self.files if f.tokenizer_name})
        self.tokenizer_names = names

    def read(self, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        """Tokens [start, start + count) of the stream as int64 (into `out` when given)."""
        if out is None:
            out = np.empty(count, dtype=np.int64)
        if start < 0 or start + count > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + count}) are outside {self.folder} ({self.num_tokens} tokens)")
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        done = 0
        while done < count:
            file = self.files[i]
            local = start + done - int(self.starts[i])
            take = min(count - done, file.num_tokens - local)
            out[done : done + take] = file.tokens[local : local + take]
            done += take
            i += 1
        return out

    def __repr__(self) -> str:
        return f"TokenizedFolder({str(self.folder)!r}, {len(self.files)} files, {self.num_tokens} tokens)"


class TokenFileWriter:
    """Writes one token file in datatrove's format, under temporary names until `close()`.

    The three files appear under their real names only when complete (the metadata last), so
    an interrupted writer leaves no file a reader would take, and a completed one is never
    rewritten.
    """

    def __init__(self, path: str | Path, token_size: int, tokenizer_name: str) -> None:
        if token_size not in TOKEN_DTYPES:
            raise ValueError(f"token_size={token_size}; datatrove token files use 2 or 4 bytes per token")
        self.path = Path(path)
        self.dtype = TOKEN_DTYPES[token_size]
        self.token_size = token_size
        self.tokenizer_name = tokenizer_name
        self._part = self.path.with_name(self.path.name + ".part")
        self._file = open(self._part, "wb")  # noqa: SIM115 - closed in close()
        self._ends: list[int] = []
        self.num_tokens = 0

    def write(self, tokens: np.ndarray | list[int]) -> None:
        """Append one document's tokens."""
        array = np.asarray(tokens, dtype=self.dtype)
        array.tofile(self._file)
        self.num_tokens += len(array)
        self._ends.append(self.num_tokens)

    def close(self) -> None:
        self._file.close()
        final = self.path
        index = final.with_name(final.name + ".index")
        metadata = final.with_name(final.name + ".metadata")
        np.asarray(self._ends, dtype="<u8").tofile(index.with_name(index.name + ".part"))
        metadata.with_name(metadata.name + ".part").write_text(
            f"{self.tokenizer_name}|{self.token_size}\n{self.num_tokens}\n{_in_words(self.num_tokens)}T",
            encoding="utf-8",
        )
        self._part.replace(final)
        index.with_name(index.name + ".part").replace(index)
        metadata.with_name(metadata.name + ".part").replace(metadata)


def _in_words(count: int) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} "
