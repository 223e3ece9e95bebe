"""Local text data read by kenotron itself: JSON Lines, JSON arrays, text paragraphs, Parquet.

No `datasets` and no cache: files are read front to back, and the position of a document is
(file number, byte offset) for JSON Lines and text, (file number, row) for JSON arrays and
Parquet, so resuming seeks straight to it.

- `.jsonl` (and `.json` files holding one object per line): one record per line, blank lines
  skipped; `data.text_field` names the text.
- `.json` holding one array of records: read whole into memory (fine for small files; give
  large data as JSON Lines).
- `.txt`: one document per paragraph, paragraphs separated by a blank line ("\\n\\n"); empty
  paragraphs are skipped, line breaks inside a paragraph kept.
- `.parquet`: one record per row (needs pyarrow); rows are read one row group at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from kenotron.data.file_checks import check_not_empty, json_line_error, missing_field_error
from kenotron.data.text_source import (
    LOCAL_FORMATS,
    SUFFIX_FORMATS,
    Document,
    DocumentSource,
    check_text_field,
    text_of,
)
from kenotron.errors import DataError

_READ_CHUNK = 1 << 20


def resolve_local_files(dataset: str, path: str, key: str = "data.path") -> tuple[str, list[Path]]:
    """The format and sorted file list for `data.dataset` / `data.path` (`key`: the config key
    that holds the path, `validation.path` say; errors name it and its dataset key)."""
    dataset_key = key.rpartition(".")[0] + ".dataset"
    if not path:
        raise DataError(
            f"{dataset_key}={dataset!r} reads local files but {key} is empty; "
            "give a local json/jsonl/parquet/txt file or folder"
        )
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"{key}={path!r} does not exist; give a local json/jsonl/parquet/txt file or folder"
        )
    if root.is_file():
        files = [root]
    else:
        files = sorted(
            f
            for f in root.rglob("*")
            if f.is_file()
            and f.suffix.lower() in SUFFIX_FORMATS
            # Hidden files and folders (.ipynb_checkpoints, .cache) are not data.
            and not any(part.startswith(".") for part in f.relative_to(root).parts)
        )
        if dataset != "auto":
            wanted = {"json": ("json", "jsonl"), "jsonl": ("json", "jsonl")}.get(dataset, (dataset,))
            files = [f for f in files if SUFFIX_FORMATS[f.suffix.lower()] in wanted]
        if not files:
            kind = "json/jsonl/parquet/txt" if dataset == "auto" else dataset
            raise FileNotFoundError(
                f"{key}={path!r} is a folder without {kind} files; put the data files "
                f"there or point {key} at one file"
            )
    if dataset != "auto":
        return ("jsonl" if dataset == "json" else dataset), files
    formats = {SUFFIX_FORMATS.get(f.suffix.lower()) for f in files}
    formats = {"jsonl" if f == "json" else f for f in formats}
    if None in formats or len(formats) != 1:
        suffixes = sorted({f.suffix or "(none)" for f in files})
        raise DataError(
            f"{dataset_key}='auto' cannot tell the format of {key}={path!r} (file endings "
            f"{suffixes}); use one of .json/.jsonl/.parquet/.txt, or set {dataset_key} to "
            f"one of {', '.join(LOCAL_FORMATS)}"
        )
    return formats.pop(), files


def is_json_array(path: Path) -> bool:
    """Whether a .json/.jsonl file holds one JSON array (not JSON Lines)."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


class LocalDocuments(DocumentSource):
    """Documents of local files, in file order; position = (file, offset) plus epoch and index."""

    def __init__(self, name: str, files: list[Path], fmt: str, text_field: str, where: str = "",
                 key: str = "data.path") -> None:
        super().__init__(name)
        self.where = where or name  # the config key and path that errors name
        self.field_key = key.rpartition(".")[0] + ".text_field"  # the key naming the text field
        self.files = files
        self.format = fmt
        self.text_field = text_field
        self.file = 0
        self.offset = 0  # byte offset (jsonl, text) or row (json arrays, parquet)
        self._handle: IO[bytes] | None = None
        self._buffer = b""  # text files: bytes read from the file; `offset` is at _buffer[_start]
        self._start = 0
        self._rows: list[Any] | None = None  # json arrays / the current parquet row group
        self._rows_start = 0
        self._first_check = True

    def _position_extra(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset}

    def _seek(self, state: dict[str, Any]) -> None:
        self.file, self.offset = int(state.get("file", 0)), int(state.get("offset", 0))
        if not 0 <= self.file < len(self.files):
            raise DataError(
                f"the saved position names file {self.file} of {self.name}, which has {len(self.files)} files; the "
                "checkpoint was made with other data"
            )
        self._close()

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle, self._buffer, self._start, self._rows = None, b"", 0, None

    def _next_file(self) -> None:
        self._close()
        self.file, self.offset = self.file + 1, 0
        if self.file == len(self.files):
            if self.index == 0:
                raise DataError(f"{self.name} holds no documents; give a non-empty dataset")
            self.file, self.epoch, self.index = 0, self.epoch + 1, 0

    def next_document(self) -> Document:
        while True:
            position = self.state_dict()
            text = self._read_one()
            if text is not None:
                document = Document(self.epoch, self.index, text, position)
                self.index += 1
                return document
            self._next_file()

    # -- one record from the current file, or None at its end ---------------------------------

    def _read_one(self) -> str | None:
        path = self.files[self.file]
        if self.format == "parquet":
            return self._read_row(path)
        if self._rows is None and self._handle is None:  # a file not opened yet
            if self.format == "jsonl" and is_json_array(path):
                self._rows = self._load_json_array(path)
            else:
                self._handle = open(path, "rb")  # noqa: SIM115 - kept open across calls
                self._handle.seek(self.offset)
        if self._rows is not None:
            return self._read_row(path)
        return self._read_line(path) if self.format == "jsonl" else self._read_paragraph()

    def _read_line(self, path: Path) -> str | None:
        assert self._handle is not None
        while True:
            line = self._handle.readline()
            if not line:
                return None
            self.offset += len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise json_line_error(self.where, path, self.offset - len(line), line, err) from None
            if not isinstance(record, dict):
                raise json_line_error(self.where, path, self.offset - len(line), line, None)
            if not self._first_check and self.text_field not in record:  # the first record's error names the columns
                raise missing_field_error(self.where, path, self.offset - len(line), self.text_field, list(record),
                                          self.field_key)
            return self._text(record)

    def _read_paragraph(self) -> str | None:
        assert self._handle is not None
        while True:
            end = self._buffer.find(b"\n\n", self._start)
            if end < 0:
                chunk = self._handle.read(_READ_CHUNK)
                if chunk:
                    self._buffer = self._buffer[self._start :] + chunk
                    self._start = 0
                    continue
                end = len(self._buffer)
                if end == self._start:
                    return None
            paragraph = self._buffer[self._start : end]
            consumed = min(end + 2, len(self._buffer)) - self._start
            self._start += consumed
            self.offset += consumed
            if paragraph:
                return paragraph.decode("utf-8", errors="replace")

    def _read_row(self, path: Path) -> str | None:
        in_group = self._rows is not None and self._rows_start <= self.offset < self._rows_start + len(self._rows)
        if self.format == "parquet" and not in_group and not self._load_row_group(path):
            return None
        assert self._rows is not None
        row = self.offset - self._rows_start
        if row >= len(self._rows):
            return None
        self.offset += 1
        value = self._rows[row]
        return value if self.format == "parquet" else self._text(value)

    def _text(self, record: dict[str, Any]) -> str:
        if self._first_check:
            check_text_field(self.name, list(record), self.text_field)
            self._first_check = False
        return text_of(record, self.text_field, self.name)

    def _load_json_array(self, path: Path) -> list[Any]:
        try:
            records = json.loads(path.read_bytes())
        except ValueError as err:
            raise DataError(f"could not read {path} as JSON ({err}); fix the file or give JSON Lines") from err
        self._rows_start = 0
        return records

    def _load_row_group(self, path: Path) -> bool:
        """Load the row group holding row `offset` of a Parquet file; False past the last row."""
        # optional package: only Parquet files need pyarrow
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except Exception as err:
            raise DataError(f"could not read {path} as Parquet ({type(err).__name__}: {err})") from err
        if self._first_check:
            check_text_field(self.name, parquet.schema_arrow.names, self.text_field)
            self._first_check = False
        start = 0
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if start <= self.offset < start + rows:
                column = parquet.read_row_group(group, columns=[self.text_field]).column(0)
                values = column.to_pylist()
                for value in values:
                    if value is not None and not isinstance(value, str):
                        text_of({self.text_field: value}, self.text_field, self.name)  # raises the type error
                self._rows, self._rows_start = ["" if v is None else v for v in values], start
                return True
            start += rows
        return False


def open_local_documents(dataset: str, path: str, text_field: str = "text", key: str = "data.path") -> LocalDocuments:
    """The documents of local files named by `data.dataset` and `data.path` (`key`: the config key
    that holds the path, named by errors)."""
    fmt, files = resolve_local_files(dataset, path, key)
    where = f"{key}={path!r}"
    check_not_empty([str(f) for f in files], where)
    source = LocalDocuments(f"{fmt} files at {path!r}", files, fmt, text_field, where, key)
    if fmt == "parquet":
        try:
            # optional package: only Parquet files need pyarrow
            import pyarrow.parquet  # noqa: F401
        except ImportError as err:
            raise ImportError("reading Parquet files needs pyarrow; pip install pyarrow") from err
    # Read the first document now, so a wrong text field or empty data fails before training.
    start = source.state_dict()
    source.next_document()
    source.load_state_dict(start)
    return source
