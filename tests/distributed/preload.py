"""Imported once, by the worker pools' fork server only (pool.py's `_PRELOAD`): work that every
rank of every pool would otherwise repeat, done before the fork and shared copy-on-write.

Most multi-rank tests train on the built-in corpus, which each process reads on first use from
the package's checksummed snapshot (kenotron.data.corpus; ~10 ms). Reading it here once shares
the decoded documents copy-on-write; a worker gets the same documents as a process that reads
them itself.
"""

from __future__ import annotations

import kenotron.train.trainer  # noqa: F401  (the trainer's modules, imported by nearly every call)
from kenotron.data.corpus import builtin_documents

builtin_documents()
