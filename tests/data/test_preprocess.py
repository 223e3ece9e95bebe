"""`kenotron preprocess`'s library: the tokenized folder holds exactly the packed stream of the
raw text, in input order, and an interrupted run resumes without redoing finished work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kenotron.data.dataset_path import open_documents
from kenotron.data.packing import PackedWindows
from kenotron.data.preprocess import preprocess
from kenotron.data.sources import TokenizedWindows
from kenotron.data.token_files import TokenizedFolder
from kenotron.data.tokenizer_path import build_tokenizer

TEXTS = [f"Record {i}: " + "some words " * (i % 9) + "🙂" * (i % 3) for i in range(120)]


def write_jsonl(path, texts=TEXTS):
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"text": text, "id": i}) + "\n")
            if i % 50 == 0:
                f.write("\n")  # blank lines are skipped
    return path


def packed_stream(dataset, path, count, seq_len=31):
    packer = PackedWindows(open_documents(dataset, str(path)), build_tokenizer(""), seq_len)
    return np.stack([packer.next_window() for _ in range(count)])


def tokenized_stream(folder, count, seq_len=31):
    windows = TokenizedWindows(TokenizedFolder(folder), shuffle=False)
    return windows.windows(np.arange(count), seq_len + 1)


def test_builtin_corpus_folder_equals_the_packed_raw_text(tmp_path):
    counts = preprocess("builtin", "", tmp_path / "out", "", workers=1, progress=False)
    assert counts["documents"] == 1910
    folder = TokenizedFolder(tmp_path / "out")
    assert folder.num_tokens == counts["tokens"]
    assert np.array_equal(tokenized_stream(tmp_path / "out", 200), packed_stream("builtin", "", 200))


def test_jsonl_cut_into_byte_ranges_keeps_every_record_in_order(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl")
    counts = preprocess("jsonl", str(path), tmp_path / "out", "", workers=1, chunk_bytes=1000, progress=False)
    assert counts["tasks"] > 5 and counts["documents"] == len(TEXTS)
    n = TokenizedFolder(tmp_path / "out").num_tokens // 32
    assert np.array_equal(tokenized_stream(tmp_path / "out", n), packed_stream("jsonl", path, n))


def test_interrupted_run_resumes_and_gives_the_same_folder(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    preprocess("jsonl", str(path), out, "", workers=1, chunk_bytes=1000, progress=False)
    whole = {p.name: p.read_bytes() for p in out.iterdir()}
    # A crash in task 3: its token file never got its final names (only a .part remains).
    for suffix in (".ds", ".ds.index", ".ds.metadata"):
        (out / f"00003{suffix}").unlink()
    (out / "00003.ds.part").write_bytes(b"half written")
    counts = preprocess("jsonl", str(path), out, "", workers=1, chunk_bytes=1000, progress=False)
    assert counts["skipped"] == counts["tasks"] - 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == whole


def test_another_input_into_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    preprocess("jsonl", str(write_jsonl(tmp_path / "a.jsonl")), out, "", workers=1, progress=False)
    with pytest.raises(ValueError, match="holds the output of another preprocessing .*path.* differ"):
        preprocess("jsonl", str(write_jsonl(tmp_path / "b.jsonl", TEXTS[:5])), out, "", workers=1, progress=False)


@pytest.mark.slow
def test_worker_processes_write_the_same_files(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl")
    preprocess("jsonl", str(path), tmp_path / "one", "", workers=1, chunk_bytes=2000, progress=False)
    preprocess("jsonl", str(path), tmp_path / "two", "", workers=2, chunk_bytes=2000, progress=False)
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").glob("*.ds*")}
    assert one == {p.name: p.read_bytes() for p in (tmp_path / "two").glob("*.ds*")}
