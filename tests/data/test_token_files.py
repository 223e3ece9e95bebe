"""Token files in datatrove's format: writing, reading across files, and every check on opening."""

from __future__ import annotations

import numpy as np
import pytest

from kenotron.data.token_files import (
    TokenFileError,
    TokenFileWriter,
    TokenizedFolder,
    open_token_file,
)

DOCS = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]]


def write(folder, name="00000.ds", docs=DOCS, token_size=2):
    folder.mkdir(parents=True, exist_ok=True)
    writer = TokenFileWriter(folder / name, token_size, "test-tokenizer")
    for doc in docs:
        writer.write(doc)
    writer.close()
    return folder / name


def test_written_file_has_datatrove_layout(tmp_path):
    path = write(tmp_path)
    assert np.fromfile(path, "<u2").tolist() == [t for doc in DOCS for t in doc]
    assert np.fromfile(path.with_name("00000.ds.index"), "<u8").tolist() == [3, 4, 8, 10]
    lines = path.with_name("00000.ds.metadata").read_text().splitlines()
    assert lines[:2] == ["test-tokenizer|2", "10"]
    opened = open_token_file(path)
    assert (opened.token_size, opened.num_tokens, opened.num_documents) == (2, 10, 4)
    assert not list(tmp_path.glob("*.part"))


def test_unfinished_writer_leaves_no_file_a_reader_takes(tmp_path):
    writer = TokenFileWriter(tmp_path / "00000.ds", 2, "t")
    writer.write([1, 2])
    with pytest.raises(FileNotFoundError, match="holds no .ds token files"):
        TokenizedFolder(tmp_path)


def test_folder_is_one_stream_across_files(tmp_path):
    write(tmp_path, "00000.ds", [[1, 2, 3]])
    write(tmp_path, "00001.ds", [[4, 5], [6]], token_size=4)
    write(tmp_path / "sub", "00002.ds", [[7, 8, 9]])
    folder = TokenizedFolder(tmp_path)
    assert folder.num_tokens == 9
    assert folder.read(0, 9).tolist() == list(range(1, 10))
    assert folder.read(2, 5).tolist() == [3, 4, 5, 6, 7]  # spans three files
    assert folder.read(2, 5).dtype == np.int64
    with pytest.raises(IndexError):
        folder.read(5, 5)


def test_truncated_token_file(tmp_path):
    path = write(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\x01")
    with pytest.raises(TokenFileError, match=r"21 bytes, not a whole number of 2-byte tokens: it is truncated"):
        open_token_file(path)


def test_token_file_shorter_than_its_metadata(tmp_path):
    path = write(tmp_path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(TokenFileError, match=r"holds 8 tokens but 00000.ds.metadata says 10"):
        open_token_file(path)


def test_index_that_does_not_match_its_token_file(tmp_path):
    path = write(tmp_path)
    np.array([3, 4, 8, 12], "<u8").tofile(path.with_name("00000.ds.index"))
    with pytest.raises(TokenFileError, match=r"ends at token 12 but 00000.ds holds 10 tokens: the index does not match"):
        open_token_file(path)
    np.array([3, 8, 4, 10], "<u8").tofile(path.with_name("00000.ds.index"))
    with pytest.raises(TokenFileError, match="goes backwards"):
        open_token_file(path)
    path.with_name("00000.ds.index").write_bytes(b"\x00" * 13)
    with pytest.raises(TokenFileError, match="13 bytes, not a whole number of uint64"):
        open_token_file(path)


def test_foreign_files(tmp_path):
    foreign = tmp_path / "weights.ds"
    foreign.write_bytes(b"\x93NUMPY" + bytes(100))
    with pytest.raises(TokenFileError, match="has neither weights.ds.index nor weights.ds.metadata"):
        open_token_file(foreign)
    # An index from another file: the sizes disagree.
    np.array([7], "<u8").tofile(tmp_path / "weights.ds.index")
    with pytest.raises(TokenFileError, match="holds 106 bytes but its index ends at token 7"):
        open_token_file(foreign)
    (tmp_path / "weights.ds.metadata").write_text("no pipe here\n")
    with pytest.raises(TokenFileError, match="is not datatrove token metadata"):
        open_token_file(foreign)


def test_index_alone_gives_the_token_size(tmp_path):
    path = write(tmp_path, token_size=4)
    path.with_name("00000.ds.metadata").unlink()
    assert open_token_file(path).token_size == 4
