import hashlib
import json
import subprocess
import sys
from pathlib import Path

import kenotron.data.corpus as corpus_module
from kenotron.data.corpus import builtin_documents, module_documents

# Loads corpus.py on its own (no kenotron package, so no torch, no datasets) in a fresh
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


def test_corpus_is_the_same_in_any_process():
    # Run side by side: this process has torch and datasets imported (torch monkeypatches
    # inspect.getfile), the fresh one has neither; the text must not notice.
    fresh = subprocess.Popen(
        [sys.executable, "-I", "-c", STANDALONE, corpus_module.__file__],
        stdout=subprocess.PIPE,
        text=True,
    )
    import datasets  # noqa: F401  (imported on purpose, see above)
    import torch  # noqa: F401

    documents = builtin_documents()
    out, _ = fresh.communicate(timeout=120)
    report = json.loads(out)
    assert report["heavy"] == []
    assert report["digest"] == digest(documents)

    from pydoc_data.topics import topics

    # Every help topic is in, and the fixed shuffle interleaves them with the API text.
    positions = sorted(documents.index(topics[name]) for name in topics)
    assert len(positions) == len(topics)
    assert positions[-1] - positions[0] > len(documents) // 2
    assert len(documents) > 1000
    assert sum(len(d) for d in documents) > 1_200_000


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
    assert module_documents("mod", source) == [
        "# mod\n\nModule doc.\n",
        "## mod.public\n\ndef public(a, b=1)\n\nAdds.\n",
        "## mod.Thing\n\nclass Thing(Base)\n\nA thing.\n\n### mod.Thing.method\n\ndef method(self)\n\nDoes.\n",
    ]


def test_modules_exist_in_this_python():
    # A typo in the module list would silently shrink the corpus.
    missing = [m for m in corpus_module.STDLIB_MODULES if corpus_module._module_source(m) is None]
    allowed = {"turtle", "lzma", "bz2"}  # distributions may leave out tkinter or compressors
    assert set(missing) <= allowed, missing
    assert Path(corpus_module.__file__).is_file()
