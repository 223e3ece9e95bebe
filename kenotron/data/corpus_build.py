"""How the built-in corpus was made: English text and code from a CPython's own documentation.

kenotron reads the corpus from the snapshot shipped in the package (corpus.py), never from the
running Python: the documentation differs between patch versions (1,899 documents on 3.11.2,
1,910 on 3.11.7, 1,898 on 3.12.1), and so would the tokens and the losses. This module is what
built that snapshot (from CPython 3.11.7), kept to rebuild or extend it on purpose:

    python -m kenotron.data.corpus_build kenotron/data/assets/builtin_corpus.json.gz

then put the printed SHA-256 into corpus.SNAPSHOT_SHA256 (and the tests' pinned digests).

Two parts:

1. the 79 topics of the Python language reference that `help()` shows
   (`pydoc_data.topics.topics`, ~465 KB), sorted by topic name;
2. for a fixed list of pure-Python standard-library modules, one document per module
   docstring and one per public top-level class or function: its signature and docstring,
   and for a class those of its documented public methods, in source order.

The two parts are then interleaved by a fixed permutation (a seeded shuffle, stored in the
snapshot), so any stretch of training sees both prose and API text: a debug run's loss then
falls smoothly instead of jumping where one kind of text gives way to the other.

The docstrings are read from the modules' source files with `ast`, never from live objects:
importing nothing means no side effects, and the text cannot depend on what was imported or
monkeypatched before (torch, for one, replaces `inspect.getfile`). The order is fixed (sorted
topic names, a fixed module list, source order).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import platform
import random
import sys
from pathlib import Path
from pydoc_data.topics import topics

# Pure-Python modules present in CPython 3.11 through 3.14 (none of those removed in 3.12 or
# 3.13). A module whose source cannot be found (a stripped or zipped install without .py
# files, or tkinter/turtle left out by a distribution) is skipped.
# fmt: off
STDLIB_MODULES: tuple[str, ...] = (
    "abc", "argparse", "ast", "asyncio.base_events", "asyncio.events", "asyncio.futures",
    "asyncio.locks", "asyncio.queues", "asyncio.streams", "asyncio.subprocess", "asyncio.tasks",
    "base64", "bdb", "bisect", "bz2", "calendar", "cmd", "code", "codecs", "codeop",
    "collections", "colorsys", "concurrent.futures.process", "concurrent.futures.thread",
    "configparser", "contextlib", "contextvars", "copy", "copyreg", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "dis", "doctest", "email.headerregistry", "email.message",
    "email.parser", "email.policy", "email.utils", "enum", "filecmp", "fileinput", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "graphlib", "gzip",
    "hashlib", "heapq", "hmac", "html", "html.parser", "http.client", "http.cookiejar",
    "http.cookies", "http.server", "imaplib", "importlib.abc", "importlib.metadata",
    "importlib.util", "inspect", "io", "ipaddress", "json", "json.decoder", "json.encoder",
    "keyword", "linecache", "locale", "logging", "logging.handlers", "lzma", "mailbox",
    "mimetypes", "multiprocessing.connection", "multiprocessing.managers", "multiprocessing.pool",
    "netrc", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools",
    "pkgutil", "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "pydoc", "queue",
    "quopri", "random", "reprlib", "sched", "secrets", "selectors", "shelve", "shlex", "shutil",
    "smtplib", "socket", "socketserver", "stat", "statistics", "string", "subprocess",
    "symtable", "sysconfig", "tabnanny", "tarfile", "tempfile", "textwrap", "threading",
    "timeit", "tokenize", "trace", "traceback", "tracemalloc", "turtle", "types", "typing",
    "unittest.case", "unittest.loader", "unittest.mock", "urllib.parse", "urllib.request",
    "urllib.robotparser", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.dom.pulldom", "xml.etree.ElementTree", "xml.sax.handler", "xml.sax.saxutils",
    "zipfile", "zipimport", "zoneinfo",
)
# fmt: on

SHUFFLE_SEED = 1234
"""Seed of the fixed permutation that interleaves the two parts (stored in the snapshot as `order`)."""
SNAPSHOT_FORMAT = "kenotron-builtin-corpus/1"
"""Format tag of the snapshot file; corpus.py reads only this one."""

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _module_source(module_name: str) -> str | None:
    """Source text of a stdlib module without importing it (parent packages are imported)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None:
        return None
    get_source = getattr(spec.loader, "get_source", None)
    source = get_source(module_name) if get_source is not None else None
    # Frozen modules (os, io, abc, codecs, ... since 3.11) have no get_source but keep the
    # path of their .py file in loader_state.
    filename = getattr(spec.loader_state, "filename", None)
    if source is None and filename and Path(filename).is_file():
        source = Path(filename).read_text(encoding="utf-8")
    return source


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
        return f"class {node.name}({bases})" if bases else f"class {node.name}"
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)})"


def _public_definitions(
    body: list[ast.stmt],
) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    return [n for n in body if isinstance(n, _DEFINITIONS) and not n.name.startswith("_")]


def _join(sections: list[str]) -> str:
    return "\n\n".join(section for section in sections if section) + "\n"


def module_documents(module_name: str, source: str) -> list[str]:
    """Markdown-ish documents of a module's docstrings: `# module` and its docstring, then per
    public definition a `## module.name` header, its signature and its docstring (for a class,
    followed by its documented public methods)."""
    tree = ast.parse(source)
    documents = [_join([f"# {module_name}", ast.get_docstring(tree) or ""])]
    for node in _public_definitions(tree.body):
        sections = [f"## {module_name}.{node.name}", _signature(node), ast.get_docstring(node) or ""]
        if isinstance(node, ast.ClassDef):
            for method in _public_definitions(node.body):
                method_doc = ast.get_docstring(method)
                if method_doc:
                    sections += [f"### {module_name}.{node.name}.{method.name}", _signature(method), method_doc]
        documents.append(_join(sections))
    return documents


def _stdlib_documents() -> list[str]:
    documents = []
    for module_name in STDLIB_MODULES:
        source = _module_source(module_name)
        if source is not None:
            documents.extend(module_documents(module_name, source))
    return documents


def _help_topic_documents() -> list[str]:
    return [topics[name] for name in sorted(topics)]


def documents_of_this_python() -> dict[str, list[str]]:
    """The two domains as the running Python's documentation gives them: `reference` (the help
    topics: prose) and `stdlib` (the modules' signatures and docstrings: API text)."""
    return {"reference": _help_topic_documents(), "stdlib": _stdlib_documents()}


def snapshot_bytes(domains: dict[str, list[str]]) -> bytes:
    """The snapshot file of `domains`: gzip'd JSON, byte for byte the same for the same text (no
    time stamp, no file name). `order` lists, for each document of the interleaved corpus, its
    index in reference + stdlib: stored, not recomputed, so that no Python's `random` matters."""
    order = list(range(sum(len(documents) for documents in domains.values())))
    random.Random(SHUFFLE_SEED).shuffle(order)
    body = {"format": SNAPSHOT_FORMAT, "built_with": f"{platform.python_implementation()} {platform.python_version()}",
            "domains": domains, "order": order}
    text = json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(text, compresslevel=9, mtime=0)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m kenotron.data.corpus_build OUT.json.gz", file=sys.stderr)
        return 2
    data = snapshot_bytes(documents_of_this_python())
    Path(argv[0]).write_bytes(data)
    print(f"wrote {argv[0]}: {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
