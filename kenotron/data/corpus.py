"""The built-in corpus: English text and code from Python's own documentation, shipped in the package.

Read from `assets/builtin_corpus.json.gz`, a snapshot made once from CPython 3.11.7's help
topics and standard-library docstrings (corpus_build.py says how, and rebuilds it), never from
the running Python: their documentation differs between patch versions, and with it the
documents, the tokens and every loss of the quick start. So every Python gives the same 1,910
documents, and the file's SHA-256 is checked against SNAPSHOT_SHA256 before it is used.

Two domains: `reference` (the language reference's 79 help topics: prose) and `stdlib` (the
modules' signatures and docstrings: API text). `builtin_documents` interleaves them by the
fixed permutation stored in the snapshot, so any stretch of training sees both.

This module imports nothing heavy (no torch, no datasets): data-loading processes read it cheaply.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from pathlib import Path

from kenotron.errors import DataError

SNAPSHOT_PATH = Path(__file__).parent / "assets" / "builtin_corpus.json.gz"
"""The snapshot file (package data: pyproject's `data/assets/*`)."""
SNAPSHOT_SHA256 = "c483bee02058c5e3ce669f06c7663a0bb30fcc3fb22eb5cf2a69fa8ce5bd77ef"
"""SHA-256 of the snapshot file: a changed or damaged file is refused, never trained on."""
SNAPSHOT_FORMAT = "kenotron-builtin-corpus/1"
"""Format tag inside the snapshot (corpus_build.SNAPSHOT_FORMAT)."""


@functools.cache
def _snapshot() -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    # ~0.4 MB to read and check once per process; the result is kept immutable.
    fix = "reinstall kenotron (pip install --force-reinstall), or restore the file from the repository"
    try:
        data = SNAPSHOT_PATH.read_bytes()
    except OSError as exc:
        raise DataError(f"the built-in corpus {SNAPSHOT_PATH} cannot be read ({exc.strerror or exc}); {fix}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != SNAPSHOT_SHA256:
        raise DataError(f"the built-in corpus {SNAPSHOT_PATH} has SHA-256 {digest}, expected {SNAPSHOT_SHA256}: "
                        f"the file was changed or damaged; {fix}")
    body = json.loads(gzip.decompress(data))
    if body.get("format") != SNAPSHOT_FORMAT:  # a rebuilt file of another format with its checksum updated
        raise DataError(f"the built-in corpus {SNAPSHOT_PATH} has format {body.get('format')!r}, expected "
                        f"{SNAPSHOT_FORMAT!r}; rebuild it with python -m kenotron.data.corpus_build")
    domains = {name: tuple(documents) for name, documents in body["domains"].items()}
    every = [text for documents in domains.values() for text in documents]
    return domains, tuple(every[i] for i in body["order"])


def builtin_documents() -> list[str]:
    """The built-in corpus as a list of documents, in a fixed order (see the module docstring)."""
    return list(_snapshot()[1])


def builtin_domains() -> dict[str, list[str]]:
    """The built-in corpus as two domains, each in a fixed order: `reference` (the language
    reference's help topics: prose) and `stdlib` (the modules' signatures and docstrings: API text)."""
    return {name: list(documents) for name, documents in _snapshot()[0].items()}
