"""Plain-words errors for local data files that the `datasets` reader only calls invalid.

An empty file reaches HF's reader as "StopIteration" or "An error occurred while generating
the dataset", and a malformed JSON line as the same, without a line number. These checks name
the file and the line: the emptiness check runs before reading (it looks at the first bytes of
each file), the JSON scan only after the reader failed.
"""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.errors import DataError

_PEEK_BYTES = 1 << 16


def check_not_empty(files: list[str], path: str) -> None:
    """DataError when every one of `files` is empty (or holds only whitespace)."""
    if any(_has_content(Path(f)) for f in files):
        return
    what = f"the file {files[0]!r} is" if len(files) == 1 else f"all {len(files)} data files under it are"
    raise DataError(f"data.path={path!r}: {what} empty; give data holding at least one document")


def _has_content(file: Path) -> bool:
    with open(file, "rb") as f:
        while chunk := f.read(_PEEK_BYTES):
            if chunk.strip():
                return True
    return False


def first_json_error(files: list[str]) -> str | None:
    """Where the first of `files` that is not valid JSON Lines (or one JSON document) breaks:
    `file 'x.jsonl' line 3 is not valid JSON (Expecting value, column 10): '{"text": broken'`."""
    for name in files:
        text = Path(name).read_text(errors="replace")
        if text.lstrip().startswith("["):  # one JSON array, possibly over many lines
            try:
                json.loads(text)
            except json.JSONDecodeError as err:
                line = text.splitlines()[err.lineno - 1] if text.splitlines() else ""
                return f"file {name!r} line {err.lineno} is not valid JSON ({err.msg}, column {err.colno}): {line[:60]!r}"
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                return f"file {name!r} line {number} is not valid JSON ({err.msg}, column {err.colno}): {line[:60]!r}"
            if not isinstance(record, dict):
                return f"file {name!r} line {number} holds a JSON {type(record).__name__}, not an object with a text field"
    return None
