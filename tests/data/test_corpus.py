"""The built-in corpus (kenotron/data/corpus.py): a pinned, checksummed snapshot shipped in the
package, the same on every Python (issue 35, item 2), and the builder that made it (corpus_build.py)."""

import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

import kenotron.data.corpus as corpus_module
import kenotron.data.corpus_build as build_module
from kenotron.data.corpus import builtin_documents, builtin_domains
from kenotron.errors import DataError

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT_SHA256 = "c483bee02058c5e3ce669f06c7663a0bb30fcc3fb22eb5cf2a69fa8ce5bd77ef"
"""The shipped file. Changing the corpus changes the tokens and every loss of README and
tests/golden/: rebuild on purpose (corpus_build.py) and update both pins."""
DOCUMENTS_DIGEST = "80bf492dc0998c353d90d1064ccbdbce412b908568d54217a990101059d71259"
"""SHA-256 of the documents joined by NUL: the corpus CPython 3.11.7's documentation gave before
the snapshot existed, which tests/golden/debug_losses.jsonl was recorded on."""

# Loads corpus.py on its own (no kenotron.data package, so no torch, no datasets) in a fresh
# interpreter, and reports the corpus digest and which heavy modules got imported.
STANDALONE = """
import hashlib, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("standalone_corpus", sys.argv[1])
corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus)
documents = corpus.builtin_documents()
digest = hashlib.sha256("\\x00".join(documents).encode()).hexdigest()
print(json.dumps({"digest": digest, "heavy": sorted({"torch", "datasets"} & set(sys.modules))}))
"""


def digest(documents: list[str]) -> str:
    return hashlib.sha256("\x00".join(documents).encode()).hexdigest()


def test_the_shipped_snapshot_has_the_pinned_checksum_and_documents():
    assert hashlib.sha256(corpus_module.SNAPSHOT_PATH.read_bytes()).hexdigest() == SNAPSHOT_SHA256
    assert corpus_module.SNAPSHOT_SHA256 == SNAPSHOT_SHA256
    assert digest(builtin_documents()) == DOCUMENTS_DIGEST
    assert corpus_module.SNAPSHOT_PATH.stat().st_size < 1_000_000  # small enough for the repository


def test_another_pythons_documentation_does_not_change_the_corpus(tmp_path):
    # A Python of another patch version has other help topics: here a pydoc_data that shadows
    # this Python's. The corpus must not notice, in a fresh process without torch or datasets.
    fake = tmp_path / "pydoc_data"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "topics.py").write_text("topics = {'if': 'The if statement, as another Python documents it.'}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", STANDALONE, corpus_module.__file__], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    report = json.loads(out)
    assert report == {"digest": DOCUMENTS_DIGEST, "heavy": []}


def test_the_corpus_interleaves_the_help_topics_with_the_api_text():
    documents = builtin_documents()
    domains = builtin_domains()
    assert sorted(documents) == sorted(domains["reference"] + domains["stdlib"])
    positions = sorted(documents.index(text) for text in domains["reference"])
    assert len(positions) == len(domains["reference"]) == 79
    assert positions[-1] - positions[0] > len(documents) // 2
    assert len(documents) == 1910 and sum(len(d) for d in documents) > 1_200_000


def test_a_changed_snapshot_is_refused_in_one_line_naming_the_fix(tmp_path, monkeypatch):
    damaged = tmp_path / "builtin_corpus.json.gz"
    data = bytearray(corpus_module.SNAPSHOT_PATH.read_bytes())
    data[-9] ^= 1
    damaged.write_bytes(bytes(data))
    monkeypatch.setattr(corpus_module, "SNAPSHOT_PATH", damaged)
    corpus_module._snapshot.cache_clear()
    try:
        with pytest.raises(DataError, match=r"builtin_corpus.json.gz has SHA-256 \w+, expected c483bee0\w+: .*reinstall") as err:
            builtin_documents()
        assert "\n" not in str(err.value)
    finally:
        corpus_module._snapshot.cache_clear()


def test_pyproject_ships_the_snapshot_as_package_data():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kenotron"]
    relative = corpus_module.SNAPSHOT_PATH.relative_to(REPO / "kenotron").as_posix()
    assert any(fnmatch(relative, pattern) for pattern in patterns), (relative, patterns)


@pytest.mark.skipif(platform.python_version() != "3.11.7", reason="the snapshot was built from CPython 3.11.7's docs")
def test_the_builder_rebuilds_the_snapshot_byte_for_byte_on_the_python_it_was_made_with():
    built = build_module.snapshot_bytes(build_module.documents_of_this_python())
    assert json.loads(gzip.decompress(built))["built_with"] == "CPython 3.11.7"
    assert hashlib.sha256(built).hexdigest() == SNAPSHOT_SHA256


def test_module_documents_layout():
    source = '''"""Module doc."""
def public(a, b=1):
    """Adds."""
class Thing(Base):
    """A thing."""
    def method(self):
        """Does."""
    def undocumented(self): pass
    def _private(self):
        """Hidden."""
def _hidden():
    """Hidden."""
'''
    assert build_module.module_documents("mod", source) == [
        "# mod\n\nModule doc.\n",
        "## mod.public\n\ndef public(a, b=1)\n\nAdds.\n",
        "## mod.Thing\n\nclass Thing(Base)\n\nA thing.\n\n### mod.Thing.method\n\ndef method(self)\n\nDoes.\n",
    ]


def test_the_builders_modules_exist_in_this_python():
    # A typo in the module list would silently shrink a rebuilt corpus.
    missing = [m for m in build_module.STDLIB_MODULES if build_module._module_source(m) is None]
    allowed = {"turtle", "lzma", "bz2"}  # distributions may leave out tkinter or compressors
    assert set(missing) <= allowed, missing
