import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kenotron.data.text_source import StreamedDocuments, list_documents, open_documents

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


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "hf_cache")


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("dataset", ["explicit", "auto"])
def test_local_records(tmp_path, cache_dir, kind, dataset):
    path = write_local(tmp_path, kind)
    name = kind if dataset == "explicit" else "auto"
    source = open_documents(name, str(path), cache_dir=cache_dir)
    assert source.num_documents == len(TEXTS)
    assert read(source, len(TEXTS)) == TEXTS


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_resume_at_a_document_index(tmp_path, cache_dir, kind):
    path = str(write_local(tmp_path, kind))
    source = open_documents(kind, path, cache_dir=cache_dir)
    read(source, 4)
    state = source.state_dict()
    assert state == {"epoch": 0, "index": 4}
    resumed = open_documents(kind, path, cache_dir=cache_dir)
    resumed.load_state_dict(state)
    assert read(resumed, 3) == TEXTS[4:7]


def test_epochs_wrap_around(tmp_path, cache_dir):
    source = open_documents("jsonl", str(write_jsonl(tmp_path / "d.jsonl")), cache_dir=cache_dir)
    documents = [source.next_document() for _ in range(len(TEXTS) + 2)]
    assert [d.text for d in documents] == TEXTS + TEXTS[:2]
    assert (documents[-1].epoch, documents[-1].index) == (1, 1)
    assert source.state_dict() == {"epoch": 1, "index": 2}


def test_streaming_local_files_resume(tmp_path, cache_dir):
    path = str(write_jsonl(tmp_path / "d.jsonl"))
    source = open_documents("jsonl", path, streaming=True, cache_dir=cache_dir)
    assert isinstance(source, StreamedDocuments)
    assert read(source, len(TEXTS) + 1) == TEXTS + TEXTS[:1]
    resumed = open_documents("jsonl", path, streaming=True, cache_dir=cache_dir)
    resumed.load_state_dict({"epoch": 3, "index": 5})
    document = resumed.next_document()
    assert (document.epoch, document.index, document.text) == (3, 5, TEXTS[5])


def test_text_files_give_one_document_per_paragraph(tmp_path, cache_dir):
    path = tmp_path / "book.txt"
    path.write_text("First paragraph,\nwrapped.\n\nSecond one.\n\nThird.\n")
    source = open_documents("text", str(path), cache_dir=cache_dir)
    assert read(source, 3) == ["First paragraph,\nwrapped.", "Second one.", "Third.\n"]
    source.load_state_dict({"epoch": 0, "index": 2})
    assert source.next_document().text == "Third.\n"


def test_folder_of_files_in_sorted_order(tmp_path, cache_dir):
    folder = tmp_path / "shards"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "b.jsonl", ["b0", "b1"])
    write_jsonl(folder / "a.jsonl", ["a0"])
    write_jsonl(folder / "sub" / "c.jsonl", ["c0"])
    (folder / "README.md").write_text("not data")
    (folder / ".cache").mkdir()
    write_jsonl(folder / ".cache" / "copy.jsonl", ["hidden"])
    source = open_documents("auto", str(folder), cache_dir=cache_dir)
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


def test_wrong_text_field(tmp_path, cache_dir):
    path = str(write_jsonl(tmp_path / "d.jsonl"))
    message = r"data.text_field='content' is not a column.*\['id', 'text'\]"
    with pytest.raises(ValueError, match=message):
        open_documents("jsonl", path, text_field="content", cache_dir=cache_dir)


def test_non_text_field(tmp_path, cache_dir):
    path = str(write_jsonl(tmp_path / "d.jsonl"))
    source = open_documents("jsonl", path, text_field="id", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="data.text_field='id' .* holds int values"):
        source.next_document()


def test_invalid_file_contents(tmp_path, cache_dir):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match=r"broken.jsonl' line 2 is not valid JSON \(Expecting property name"):
        open_documents("jsonl", str(path), cache_dir=cache_dir)
    path.write_text("just text, not json\n")
    with pytest.raises(ValueError, match=r"line 1 is not valid JSON"):
        open_documents("jsonl", str(path), cache_dir=cache_dir)


def test_a_path_given_as_dataset_name(tmp_path):
    path = str(tmp_path / "data.jsonl")
    with pytest.raises(ValueError, match="looks like a local path.*data.dataset='auto'"):
        open_documents(path, "")
    with pytest.raises(ValueError, match="looks like a local path"):
        open_documents("corpus.parquet", "")


def test_empty_dataset_name():
    with pytest.raises(ValueError, match="data.dataset is empty"):
        open_documents("", "")
