"""Plain-words errors for local data files: an empty file, a line that is not JSON or lacks the text field.

Each names the file and the fix; the line errors also the line number, counted from the file's start
only when the error happens (the reader keeps byte offsets, not line numbers).
"""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.errors import DataError

_PEEK_BYTES = 1 << 16


def check_not_empty(files: list[str], where: str) -> None:
    """DataError when every one of `files` is empty (or holds only whitespace); `where` names the
    config key and its value (`validation.path='...'`)."""
    if any(_has_content(Path(f)) for f in files):
        return
    what = f"the file {files[0]!r} is" if len(files) == 1 else f"all {len(files)} data files under it are"
    raise DataError(f"{where}: {what} empty; give data holding at least one document")


def _has_content(file: Path) -> bool:
    with open(file, "rb") as f:
        while chunk := f.read(_PEEK_BYTES):
            if chunk.strip():
                return True
    return False


def _line_number(file: Path, offset: int) -> int:
    with open(file, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def missing_field_error(where: str, file: Path, offset: int, field: str, keys: list[str], field_key: str) -> DataError:
    """The one-line error for a JSON Lines record at byte `offset` of `file` without the text
    field `field` (`field_key`: the config key that names it)."""
    shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
    return DataError(f"{where}: file {str(file)!r} line {_line_number(file, offset)} has no {field!r} field (its "
                     f"fields: {shown or 'none'}); fix or remove that line, or set {field_key} to the field that holds the text")


def json_line_error(where: str, file: Path, offset: int, line: bytes, err: ValueError | None) -> DataError:
    """The one-line error for a JSON Lines record at byte `offset` of `file` that is not a JSON
    object (`err`: the decoder's error, None when it decoded to something else)."""
    number = _line_number(file, offset)
    text = line.decode("utf-8", errors="replace").rstrip("\n")
    if isinstance(err, json.JSONDecodeError):
        what = f"is not valid JSON ({err.msg}, column {err.colno}): {text[:60]!r}"
    elif err is not None:
        what = f"is not valid JSON ({err}): {text[:60]!r}"
    else:
        what = f"holds a JSON {type(json.loads(line)).__name__}, not an object with a text field"
    return DataError(f"{where}: file {str(file)!r} line {number} {what}; fix or remove that line")
