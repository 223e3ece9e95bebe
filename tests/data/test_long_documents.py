"""Long documents are tokenized in bounded pieces with the whole document's tokens, for the
built-in BPE and Hugging Face tokenizers; one that cannot be cut exactly refuses a document over
its stated size in one line (kenotron/data/long_documents.py)."""

from __future__ import annotations

import itertools
import json

import pytest

from kenotron.data.corpus import builtin_documents
from kenotron.data.hf_tokenizer import cuts_exactly
from kenotron.data.local_files import open_local_documents
from kenotron.data.long_documents import PIECE_CHARS, QWEN2_SPLIT_PATTERN, encode_documents, pieces
from kenotron.data.packing import PackedWindows
from kenotron.data.tokenizer_path import build_tokenizer
from kenotron.errors import DataError
from tests.data.hf_files import write_hf_tokenizer

GPT2_SPLIT_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The built-in BPE, and the same vocabulary through `tokenizers` with Llama 3's and Qwen2's split."""
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "builtin": build_tokenizer(""),
        "hf": build_tokenizer(str(write_hf_tokenizer(root / "llama3"))),
        "hf-qwen2": build_tokenizer(str(write_hf_tokenizer(root / "qwen2", pattern=QWEN2_SPLIT_PATTERN))),
    }


def _long_document() -> str:
    """~160k characters of the built-in corpus as one document: prose, code, tables, blank lines."""
    return "\n\n".join(builtin_documents()[:400])


@pytest.mark.parametrize("name", ["builtin", "hf", "hf-qwen2"])
def test_the_built_in_corpus_cut_into_small_pieces_gives_the_same_tokens(tokenizers, name):
    tokenizer = tokenizers[name]
    assert tokenizer.cuts_exactly
    documents = builtin_documents() if name == "builtin" else builtin_documents()[::4]
    cut = [p for d in documents for p in pieces(d, 300)]
    assert len(cut) > 2 * len(documents)  # most documents are really cut
    whole = tokenizer.encode_batch(documents)
    in_pieces = iter(tokenizer.encode_batch(cut))
    rebuilt = [[t for _ in pieces(d, 300) for t in next(in_pieces)] for d in documents]
    assert rebuilt == whole


@pytest.mark.parametrize("name", ["builtin", "hf"])
def test_a_long_jsonl_document_is_packed_from_bounded_calls_with_its_whole_tokens(tokenizers, name, tmp_path):
    tokenizer = tokenizers[name]
    text = _long_document()
    assert len(text) > 2 * PIECE_CHARS
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "a short one"}) + "\n" + json.dumps({"text": text}) + "\n")
    longest: list[int] = []
    encode_batch = tokenizer.encode_batch

    def spy(texts):
        longest.append(max(map(len, texts), default=0))
        return encode_batch(texts)

    packer = PackedWindows(open_local_documents("jsonl", str(path)), tokenizer, seq_len=4095, add_bos=False,
                           read_ahead=2)
    tokenizer.encode_batch = spy
    try:
        windows = [packer.next_window() for _ in range(4)]
    finally:
        del tokenizer.encode_batch
    assert max(longest) <= PIECE_CHARS
    stream = [t for w in windows for t in w.tolist()]
    expected = [*tokenizer.encode("a short one"), tokenizer.eos_id, *tokenizer.encode(text), tokenizer.eos_id]
    assert stream == expected[: len(stream)] and len(stream) == 4 * 4096
    assert encode_documents(tokenizer, [text]) == [tokenizer.encode(text)]


def test_a_tokenizer_that_cannot_be_cut_refuses_a_document_over_its_stated_size_in_one_line(tmp_path):
    tokenizer = build_tokenizer(str(write_hf_tokenizer(tmp_path / "gpt2", pattern=GPT2_SPLIT_PATTERN)))
    assert not tokenizer.cuts_exactly
    tokenizer.max_uncut_chars = 5000
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["short", "word " * 2000, "after"]))
    packer = PackedWindows(open_local_documents("jsonl", str(path)), tokenizer, seq_len=8, read_ahead=3)
    with pytest.raises(DataError) as refused:
        packer.next_window()
    message = str(refused.value)
    assert "\n" not in message and "document 1 of jsonl files at" in message
    assert "10,000 characters" in message and "5,000" in message and "split that document" in message


def test_only_normalizers_and_pre_tokenizers_that_never_join_across_a_cut_count_as_exact(tmp_path):
    tokenizer = json.loads((write_hf_tokenizer(tmp_path / "t") / "tokenizer.json").read_text())
    assert cuts_exactly(tokenizer)
    assert cuts_exactly({**tokenizer, "normalizer": {"type": "NFC"}})
    assert not cuts_exactly({**tokenizer, "normalizer": {"type": "Lowercase"}})
    assert not cuts_exactly({**tokenizer, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}})
    joined = {"content": "New York", "special": False, "lstrip": False, "rstrip": False}
    assert not cuts_exactly({**tokenizer, "added_tokens": [*tokenizer["added_tokens"], joined]})


def test_pieces_are_cut_only_between_a_letter_or_digit_and_a_space_or_after_a_newline():
    text = "alpha beta\n\ngamma, delta\n  epsilon 42 zeta"
    cut = list(pieces(text, 6))
    assert "".join(cut) == text
    for left, right in itertools.pairwise(cut):
        assert (left[-1].isalnum() and right[0] == " ") or (left[-1] == "\n" and not right[0].isspace())
    assert list(pieces("x" * 50, 10)) == ["x" * 50]  # no cut place: whole
