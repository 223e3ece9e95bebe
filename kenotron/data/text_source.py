"""Documents: an endless, resumable stream of text documents from one source.

`open_documents(dataset, path, ...)` picks the source from `data.dataset`:

- "builtin": the built-in corpus (kenotron.data.corpus), no download, no `datasets` import;
- "json", "jsonl", "parquet", "text", or "auto" (format from the file extension): local
  file(s) or a folder at `data.path`, read through HF `datasets` as a map-style dataset, so
  jumping to document i is O(1). Text files give one document per paragraph (blank-line
  separated); json/jsonl/parquet records give one document each (column `data.text_field`);
- anything else: a Hugging Face hub dataset name, `data.path` being its config name, always
  streamed (nothing downloaded up front); jumping to document i re-reads the first i.

A source is endless: when its documents run out it starts over and counts an epoch. Its
position (epoch, index of the next document) is its whole state, so `state_dict` /
`load_state_dict` resume it exactly. Documents are read in order, never shuffled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.data.file_checks import check_not_empty, first_json_error
from kenotron.errors import DataError

LOCAL_FORMATS = ("json", "jsonl", "parquet", "text")
# File name endings -> HF `datasets` builder.
SUFFIX_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
FORMAT_BUILDERS = {"json": "json", "jsonl": "json", "parquet": "parquet", "text": "text"}


@dataclass(frozen=True)
class Document:
    """One document and where it sits: `index` within epoch `epoch` of its source."""

    epoch: int
    index: int
    text: str


class DocumentSource(ABC):
    """Endless ordered documents with a resumable position (epoch, index of the next one)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.epoch = 0
        self.index = 0

    @abstractmethod
    def next_document(self) -> Document:
        """The document at the current position; the position moves on by one."""

    @property
    def num_documents(self) -> int | None:
        """Documents per epoch, or None when unknown until the end (streams)."""
        return None

    def __iter__(self) -> Iterator[str]:
        while True:
            yield self.next_document().text

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, epoch={self.epoch}, index={self.index})"


class IndexedDocuments(DocumentSource):
    """Documents with random access (a list, a map-style HF dataset): seeking is O(1)."""

    def __init__(self, name: str, length: int, get_text: Callable[[int], str]) -> None:
        super().__init__(name)
        if length == 0:
            raise DataError(f"{name} holds no documents; give a non-empty dataset")
        self._length = length
        self._get_text = get_text

    @property
    def num_documents(self) -> int:
        return self._length

    def next_document(self) -> Document:
        if self.index >= self._length:
            self.epoch += 1
            self.index = 0
        document = Document(self.epoch, self.index, self._get_text(self.index))
        self.index += 1
        return document


class StreamedDocuments(DocumentSource):
    """Documents read front to back (a streamed HF dataset): seeking to i re-reads i documents.

    `open_stream(start)` returns an iterable of texts from document `start` on.
    """

    def __init__(self, name: str, open_stream: Callable[[int], Iterable[str]]) -> None:
        super().__init__(name)
        self._open_stream = open_stream
        self._stream: Iterator[str] | None = None

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict(state)
        self._stream = None  # reopened at the new position on the next read

    def next_document(self) -> Document:
        if self._stream is None:
            self._stream = iter(self._open_stream(self.index))
        text = next(self._stream, None)
        if text is None:
            if self.index == 0:
                raise DataError(f"{self.name} holds no documents; give a non-empty dataset")
            self.epoch += 1
            self.index = 0
            self._stream = iter(self._open_stream(0))
            return self.next_document()
        document = Document(self.epoch, self.index, text)
        self.index += 1
        return document


def list_documents(name: str, texts: Sequence[str]) -> IndexedDocuments:
    """A source over an in-memory list of texts (the built-in corpus, tests, notebooks)."""
    return IndexedDocuments(name, len(texts), texts.__getitem__)


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "reading local files or hub datasets needs the `datasets` package; "
            "pip install datasets (or use data.dataset='builtin')"
        ) from err
    return datasets


def _builder_of_file(file: Path) -> str | None:
    return SUFFIX_BUILDERS.get(file.suffix.lower())


def resolve_local_files(dataset: str, path: str) -> tuple[str, list[str]]:
    """The HF builder name and sorted file list for `data.dataset` / `data.path`."""
    if not path:
        raise DataError(
            f"data.dataset={dataset!r} reads local files but data.path is empty; "
            "give a local json/jsonl/parquet/txt file or folder"
        )
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"data.path={path!r} does not exist; give a local json/jsonl/parquet/txt file or folder"
        )
    if root.is_file():
        files = [root]
    else:
        files = sorted(
            f
            for f in root.rglob("*")
            if f.is_file()
            and _builder_of_file(f)
            # Hidden files and folders (.ipynb_checkpoints, .cache) are not data.
            and not any(part.startswith(".") for part in f.relative_to(root).parts)
        )
        if dataset != "auto":
            wanted = FORMAT_BUILDERS[dataset]
            files = [f for f in files if _builder_of_file(f) == wanted]
        if not files:
            kind = "json/jsonl/parquet/txt" if dataset == "auto" else dataset
            raise FileNotFoundError(
                f"data.path={path!r} is a folder without {kind} files; put the data files "
                "there or point data.path at one file"
            )
    if dataset != "auto":
        return FORMAT_BUILDERS[dataset], [str(f) for f in files]
    builders = {_builder_of_file(f) for f in files}
    if None in builders or len(builders) != 1:
        suffixes = sorted({f.suffix or "(none)" for f in files})
        raise DataError(
            f"data.dataset='auto' cannot tell the format of data.path={path!r} (file endings "
            f"{suffixes}); use one of .json/.jsonl/.parquet/.txt, or set data.dataset to "
            "json, parquet or text"
        )
    return builders.pop(), [str(f) for f in files]


def _check_text_field(name: str, column_names: Sequence[str] | None, text_field: str) -> None:
    if column_names is not None and text_field not in column_names:
        raise DataError(
            f"data.text_field={text_field!r} is not a column of {name} (columns: "
            f"{list(column_names)}); set data.text_field to the column that holds the text"
        )


def _text_of(record: dict[str, Any], text_field: str, name: str) -> str:
    try:
        text = record[text_field]
    except KeyError:
        _check_text_field(name, list(record), text_field)
        raise
    if text is None:
        return ""
    if not isinstance(text, str):
        # ValueError like the other data.text_field errors: a bad column in the data set,
        # not a bad argument type; tests/data/test_text_source.py expects ValueError.
        raise DataError(
            f"data.text_field={text_field!r} of {name} holds {type(text).__name__} values, not "
            "text; set data.text_field to a string column"
        )
    return text


def _open_local(
    dataset: str, path: str, text_field: str, split: str, streaming: bool, cache_dir: str | None
) -> DocumentSource:
    builder, files = resolve_local_files(dataset, path)
    check_not_empty(files, path)
    datasets = _import_datasets()
    # Text files: one document per blank-line separated paragraph, line breaks kept.
    options = {"sample_by": "paragraph", "keep_linebreaks": True} if builder == "text" else {}
    name = f"{builder} files at {path!r}"
    try:
        data = datasets.load_dataset(
            builder,
            data_files={split: files},
            split=split,
            streaming=streaming,
            cache_dir=cache_dir,
            **options,
        )
    except Exception as err:
        where = first_json_error(files) if builder == "json" else None
        if where is not None:
            raise DataError(f"data.path={path!r}: {where}; fix or remove that line") from None
        raise DataError(
            f"could not read {name} as {builder} ({type(err).__name__}: {err}); check that the "
            "files are valid, or set data.dataset to their real format"
        ) from err
    _check_text_field(name, data.column_names, text_field)
    if streaming:
        return _streamed_hf(name, data, text_field)
    column = data.select_columns([text_field])
    return IndexedDocuments(name, len(column), lambda i: _text_of(column[i], text_field, name))


def _streamed_hf(name: str, data: Any, text_field: str) -> StreamedDocuments:
    def open_stream(start: int) -> Iterable[str]:
        records = data.skip(start) if start else data
        return (_text_of(record, text_field, name) for record in records)

    return StreamedDocuments(name, open_stream)


def _looks_like_a_path(dataset: str) -> bool:
    return (
        dataset.startswith((".", "/", "~"))
        or "\\" in dataset
        or Path(dataset).suffix.lower() in SUFFIX_BUILDERS
    )


def _open_hub(
    dataset: str, config_name: str, text_field: str, split: str, cache_dir: str | None
) -> DocumentSource:
    if _looks_like_a_path(dataset):
        raise DataError(
            f"data.dataset={dataset!r} looks like a local path, not a format or hub dataset "
            f"name; set data.dataset='auto' (or one of {', '.join(LOCAL_FORMATS)}) and "
            f"data.path={dataset!r}"
        )
    datasets = _import_datasets()
    name = f"hub dataset {dataset!r}" + (f" (config {config_name!r})" if config_name else "")
    try:
        data = datasets.load_dataset(
            dataset, name=config_name or None, split=split, streaming=True, cache_dir=cache_dir
        )
    except Exception as err:
        raise DataError(
            f"could not open {name}, split {split!r} ({type(err).__name__}: {err}); check "
            "data.dataset (a hub name such as 'HuggingFaceFW/fineweb-edu'), data.path (its "
            "config name, or '') and data.split, and that the hub is reachable"
        ) from err
    _check_text_field(name, data.column_names, text_field)
    return _streamed_hf(name, data, text_field)


def open_documents(
    dataset: str,
    path: str = "",
    text_field: str = "text",
    split: str = "train",
    streaming: bool = False,
    cache_dir: str | None = None,
) -> DocumentSource:
    """The documents named by `data.dataset` and `data.path` (see the module docstring).

    `streaming` applies to local files (read them front to back instead of building HF's
    Arrow cache first); hub datasets are always streamed. `cache_dir` is HF's cache folder
    for local files (None: HF's default).
    """
    if dataset == "builtin":
        from kenotron.data.corpus import builtin_documents

        return list_documents("the built-in corpus", builtin_documents())
    if dataset in LOCAL_FORMATS or dataset == "auto":
        return _open_local(dataset, path, text_field, split, streaming, cache_dir)
    if not dataset:
        raise DataError(
            "data.dataset is empty; use 'builtin', a local format (json, jsonl, parquet, text, "
            "auto) with data.path, or a hub dataset name"
        )
    return _open_hub(dataset, path, text_field, split, cache_dir)
