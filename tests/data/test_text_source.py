import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kenotron.data.dataset_path import open_documents
from kenotron.data.text_source import (
    StreamedDocuments,
    hf_stream_opener,
    list_documents,
)

TEXTS = [f"document {i}: " + "word " * i for i in range(7)] + ["", "ünïcödé 🙂\nsecond line"]


def write_jsonl(path, texts=TEXTS):
    with open(path, "w") as f:
        f.writelines(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(texts))
    return path


def write_local(tmp_path, kind):
    if kind == "jsonl":
        return write_jsonl(tmp_path / "data.jsonl")
    if kind == "json":
        path = tmp_path / "data.json"
        path.write_text(json.dumps([{"id": i, "text": t} for i, t in enumerate(TEXTS)]))
        return path
    if kind == "parquet":
        path = tmp_path / "data.parquet"
        pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), path)
        return path
    raise AssertionError(kind)


def read(source, count):
    return [source.next_document().text for _ in range(count)]


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("dataset", ["explicit", "auto"])
def test_local_records(tmp_path, kind, dataset):
    path = write_local(tmp_path, kind)
    name = kind if dataset == "explicit" else "auto"
    source = open_documents(name, str(path))
    assert read(source, len(TEXTS)) == TEXTS


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
def test_resume_at_a_saved_position(tmp_path, kind):
    path = str(write_local(tmp_path, kind))
    source = open_documents(kind, path)
    read(source, 4)
    state = source.state_dict()
    assert (state["epoch"], state["index"], state["file"]) == (0, 4, 0)
    resumed = open_documents(kind, path)
    resumed.load_state_dict(state)
    assert read(resumed, 3) == TEXTS[4:7]


def test_jsonl_position_is_a_byte_offset(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl")
    source = open_documents("jsonl", str(path))
    document = [source.next_document() for _ in range(3)][-1]
    with open(path, "rb") as f:
        f.seek(document.position["offset"])
        assert json.loads(f.readline())["text"] == TEXTS[2]


def test_parquet_reads_row_groups(tmp_path):
    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(10)]}), path, row_group_size=3)
    source = open_documents("parquet", str(path))
    assert read(source, 12) == [f"row {i}" for i in range(10)] + ["row 0", "row 1"]
    source.load_state_dict({"epoch": 0, "index": 7, "file": 0, "offset": 7})
    assert read(source, 2) == ["row 7", "row 8"]


def test_epochs_wrap_around(tmp_path):
    source = open_documents("jsonl", str(write_jsonl(tmp_path / "d.jsonl")))
    documents = [source.next_document() for _ in range(len(TEXTS) + 2)]
    assert [d.text for d in documents] == TEXTS + TEXTS[:2]
    assert (documents[-1].epoch, documents[-1].index) == (1, 1)
    assert source.state_dict()["epoch"] == 1 and source.state_dict()["index"] == 2


def test_streamed_hub_dataset_resumes_from_the_library_state(tmp_path):
    """A streamed `datasets` dataset (local files stand in for the hub) resumes without re-reading."""
    datasets = pytest.importorskip("datasets")
    files = [str(write_jsonl(tmp_path / f"{i}.jsonl", [f"{i}-{j}" for j in range(5)])) for i in range(2)]

    def load():
        return datasets.load_dataset("json", data_files={"train": files}, split="train", streaming=True)

    source = StreamedDocuments("stream", hf_stream_opener(load(), load, "text", "stream"))
    assert read(source, 7) == ["0-0", "0-1", "0-2", "0-3", "0-4", "1-0", "1-1"]
    state = source.state_dict()
    assert state["stream"] is not None  # the library's own position, not a count to skip
    resumed = StreamedDocuments("stream", hf_stream_opener(load(), load, "text", "stream"))
    resumed.load_state_dict(state)
    assert read(resumed, 5) == ["1-2", "1-3", "1-4", "0-0", "0-1"]
    assert resumed.epoch == 1


def test_text_files_give_one_document_per_paragraph(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("First paragraph,\nwrapped.\n\nSecond one.\n\nThird.\n")
    source = open_documents("text", str(path))
    documents = [source.next_document() for _ in range(4)]
    assert [d.text for d in documents] == ["First paragraph,\nwrapped.", "Second one.", "Third.\n", documents[0].text]
    source.load_state_dict(documents[2].position)
    assert source.next_document().text == "Third.\n"


def test_folder_of_files_in_sorted_order(tmp_path):
    folder = tmp_path / "shards"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "b.jsonl", ["b0", "b1"])
    write_jsonl(folder / "a.jsonl", ["a0"])
    write_jsonl(folder / "sub" / "c.jsonl", ["c0"])
    (folder / "README.md").write_text("not data")
    (folder / ".cache").mkdir()
    write_jsonl(folder / ".cache" / "copy.jsonl", ["hidden"])
    source = open_documents("auto", str(folder))
    assert read(source, 4) == ["a0", "b0", "b1", "c0"]


def test_builtin_source():
    from kenotron.data import builtin_documents

    source = open_documents("builtin", "")
    assert source.num_documents == len(builtin_documents()) > 1000
    assert [source.next_document().text for _ in range(3)] == builtin_documents()[:3]


def test_list_documents_resume():
    source = list_documents("letters", ["a", "b", "c"])
    source.load_state_dict({"epoch": 2, "index": 3})  # the end of epoch 2
    document = source.next_document()
    assert (document.epoch, document.index, document.text) == (3, 0, "a")


def test_missing_path_error(tmp_path):
    missing = str(tmp_path / "x.jsonl")
    with pytest.raises(FileNotFoundError) as error:
        open_documents("jsonl", missing)
    assert str(error.value) == (
        f"data.path={missing!r} does not exist; give a local json/jsonl/parquet/txt file or folder"
    )


def test_empty_path_error():
    with pytest.raises(ValueError, match="data.path is empty"):
        open_documents("parquet", "")


def test_folder_without_matching_files(tmp_path):
    write_jsonl(tmp_path / "a.jsonl")
    with pytest.raises(FileNotFoundError, match="folder without parquet files"):
        open_documents("parquet", str(tmp_path))


def test_auto_with_mixed_formats(tmp_path):
    write_jsonl(tmp_path / "a.jsonl")
    (tmp_path / "b.txt").write_text("text")
    with pytest.raises(ValueError, match=r"cannot tell the format.*\['.jsonl', '.txt'\]"):
        open_documents("auto", str(tmp_path))


def test_wrong_text_field(tmp_path):
    path = str(write_jsonl(tmp_path / "d.jsonl"))
    message = r"data.text_field='content' is not a column.*\['id', 'text'\]"
    with pytest.raises(ValueError, match=message):
        open_documents("jsonl", path, text_field="content")


def test_non_text_field_fails_when_opened(tmp_path):
    path = str(write_jsonl(tmp_path / "d.jsonl"))
    with pytest.raises(ValueError, match="data.text_field='id' .* holds int values"):
        open_documents("jsonl", path, text_field="id")


def test_invalid_file_contents(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{not json\n')
    source = open_documents("jsonl", str(path))
    assert source.next_document().text == "ok"
    with pytest.raises(ValueError, match=r"broken.jsonl' line 2 is not valid JSON \(Expecting property name.*; fix or "
                                         r"remove that line"):
        source.next_document()
    path.write_text("just text, not json\n")
    with pytest.raises(ValueError, match=r"line 1 is not valid JSON"):
        open_documents("jsonl", str(path))  # the first document is read when the source opens
    path.write_text('{"text": "ok"}\n[1, 2]\n')
    source = open_documents("jsonl", str(path))
    source.next_document()
    with pytest.raises(ValueError, match=r"line 2 holds a JSON list, not an object with a text field"):
        source.next_document()


def test_empty_local_data(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"the file '.*empty.jsonl' is empty; give data holding at least one document"):
        open_documents("jsonl", str(tmp_path / "empty.jsonl"))
    (tmp_path / "blank.txt").write_text("\n\n\n\n ")
    with pytest.raises(ValueError, match=r"blank.txt' is empty"):
        open_documents("text", str(tmp_path / "blank.txt"))


def test_a_path_given_as_dataset_name(tmp_path):
    path = str(tmp_path / "data.jsonl")
    with pytest.raises(ValueError, match="looks like a local path.*data.dataset='auto'"):
        open_documents(path, "")
    with pytest.raises(ValueError, match="looks like a local path"):
        open_documents("corpus.parquet", "")


def test_empty_dataset_name():
    with pytest.raises(ValueError, match="data.dataset is empty"):
        open_documents("", "")


def test_a_jsonl_line_without_the_text_field_is_named_by_file_line_and_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n{"body": "three", "id": 3}\n')
    source = open_documents("jsonl", str(path), key="validation.path")
    assert [source.next_document().text for _ in range(2)] == ["one", "two"]
    with pytest.raises(ValueError) as missing:
        source.next_document()
    assert str(missing.value) == (
        f"validation.path={str(path)!r}: file {str(path)!r} line 4 has no 'text' field (its fields: 'body', 'id'); "
        "fix or remove that line, or set validation.text_field to the field that holds the text"
    )
