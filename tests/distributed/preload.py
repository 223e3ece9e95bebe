"""Imported once, by the worker pools' fork server only (pool.py's `_PRELOAD`): work that every
rank of every pool would otherwise repeat, done before the fork and shared copy-on-write.

Most multi-rank tests train on the built-in corpus, which each process builds on first use by
parsing the docstrings of ~150 standard-library modules (1.5 s of CPU). Thirty-odd workers
start in a session, several at a time on two cores: building it here once saves about half a
minute. The corpus is a pure function of the Python installation (kenotron.data.corpus), so a
worker gets the same documents as a process that builds them itself.
"""

from __future__ import annotations

import kenotron.train.trainer  # noqa: F401  (the trainer's modules, imported by nearly every call)
from kenotron.data.corpus import builtin_documents

builtin_documents()
