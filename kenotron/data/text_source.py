"""Documents: an endless, resumable stream of text documents from one source, and the hub
datasets' source (`open_documents`, in dataset_path.py, picks the source from `data.dataset`).

A source is endless: when its documents run out it starts over and counts an epoch. Its
position is its whole state: `state_dict()` is where the next document is, and each Document
carries the position it was read at, so a packer can resume at the document a window starts
in. Positions are O(1) in size and resuming never re-reads earlier documents: an index for
in-memory lists, a file and byte offset (or row) for local files, and for hub streams the
`datasets` library's own iterator state (it records shard and example; with an older
`datasets` without `IterableDataset.state_dict`, resuming skips the earlier documents). Documents
are read in order, never shuffled.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kenotron.errors import DataError

LOCAL_FORMATS = ("json", "jsonl", "parquet", "text")
SUFFIX_FORMATS = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet", ".txt": "text"}


@dataclass(frozen=True)
class Document:
    """One document, where it sits (`index` within epoch `epoch`) and the position that resumes at it."""

    epoch: int
    index: int
    text: str
    position: dict[str, Any] = field(default_factory=dict, compare=False)


class DocumentSource(ABC):
    """Endless ordered documents with a resumable position.

    Subclasses keep `epoch` and `index` (of the next document) up to date and may add their
    own keys to the position (`_position_extra` / `_seek`).
    """

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

    def state_dict(self) -> dict[str, Any]:
        """Where the next document is."""
        return {"epoch": self.epoch, "index": self.index, **self._position_extra()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._seek(state)

    def _position_extra(self) -> dict[str, Any]:
        return {}

    def _seek(self, state: dict[str, Any]) -> None:
        """Move to the position `state` (epoch and index are already set)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, epoch={self.epoch}, index={self.index})"


class IndexedDocuments(DocumentSource):
    """Documents with random access (a list): the index is the whole position."""

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
        position = self.state_dict()
        document = Document(self.epoch, self.index, self._get_text(self.index), position)
        self.index += 1
        return document


class StreamedDocuments(DocumentSource):
    """Documents read front to back from a stream whose position can be saved.

    `open_stream(stream_state, index)` returns an iterator of (text, stream state after it):
    from the saved `stream_state` when there is one, else from document `index` (which may
    mean skipping `index` documents).
    """

    def __init__(self, name: str, open_stream: Callable[[Any, int], Iterator[tuple[str, Any]]]) -> None:
        super().__init__(name)
        self._open_stream = open_stream
        self._stream: Iterator[tuple[str, Any]] | None = None
        self._stream_state: Any = None

    def _position_extra(self) -> dict[str, Any]:
        return {"stream": copy.deepcopy(self._stream_state)}

    def _seek(self, state: dict[str, Any]) -> None:
        self._stream_state = copy.deepcopy(state.get("stream"))
        self._stream = None  # reopened at the new position on the next read

    def next_document(self) -> Document:
        if self._stream is None:
            self._stream = self._open_stream(self._stream_state, self.index)
        position = self.state_dict()
        item = next(self._stream, None)
        if item is None:
            if self.index == 0:
                raise DataError(f"{self.name} holds no documents; give a non-empty dataset")
            self.epoch, self.index, self._stream_state = self.epoch + 1, 0, None
            self._stream = self._open_stream(None, 0)
            return self.next_document()
        text, self._stream_state = item
        document = Document(self.epoch, self.index, text, position)
        self.index += 1
        return document


def list_documents(name: str, texts: Sequence[str]) -> IndexedDocuments:
    """A source over an in-memory list of texts (the built-in corpus, tests, notebooks)."""
    return IndexedDocuments(name, len(texts), texts.__getitem__)


def check_text_field(name: str, column_names: Sequence[str] | None, text_field: str) -> None:
    if column_names is not None and text_field not in column_names:
        raise DataError(
            f"data.text_field={text_field!r} is not a column of {name} (columns: "
            f"{list(column_names)}); set data.text_field to the column that holds the text"
        )


def text_of(record: dict[str, Any], text_field: str, name: str) -> str:
    """The text of one record, with the error that names the column when it is not text."""
    try:
        text = record[text_field]
    except KeyError:
        check_text_field(name, list(record), text_field)
        raise
    if text is None:
        return ""
    if not isinstance(text, str):
        raise DataError(
            f"data.text_field={text_field!r} of {name} holds {type(text).__name__} values, not "
            "text; set data.text_field to a string column"
        )
    return text


def import_datasets() -> Any:
    """The `datasets` package, imported when a hub dataset is read (it takes seconds to import)."""
    try:
        # on demand: datasets takes seconds to import, hub datasets only
        import datasets
    except ImportError as err:
        raise ImportError(
            "reading hub datasets needs the `datasets` package; pip install datasets (or preprocess the data "
            "elsewhere with kenotron preprocess and train from the tokenized folder)"
        ) from err
    return datasets


def looks_like_a_path(dataset: str) -> bool:
    return (
        dataset.startswith((".", "/", "~"))
        or "\\" in dataset
        or Path(dataset).suffix.lower() in SUFFIX_FORMATS
    )


def open_hub_documents(dataset: str, config_name: str, text_field: str, split: str) -> DocumentSource:
    """A hub dataset's documents, streamed through `datasets` (`data.path` is its config name)."""
    if looks_like_a_path(dataset):
        raise DataError(
            f"data.dataset={dataset!r} looks like a local path, not a format or hub dataset "
            f"name; set data.dataset='auto' (or one of {', '.join(LOCAL_FORMATS)}, or 'tokenized') and "
            f"data.path={dataset!r}"
        )
    datasets = import_datasets()
    name = f"hub dataset {dataset!r}" + (f" (config {config_name!r})" if config_name else "")

    def load() -> Any:
        return datasets.load_dataset(dataset, name=config_name or None, split=split, streaming=True)

    try:
        first = load()
    except Exception as err:
        raise DataError(
            f"could not open {name}, split {split!r} ({type(err).__name__}: {err}); check "
            "data.dataset (a hub name such as 'HuggingFaceFW/fineweb-edu'), data.path (its "
            "config name, or '') and data.split, and that the hub is reachable"
        ) from err
    check_text_field(name, first.column_names, text_field)
    return StreamedDocuments(name, hf_stream_opener(first, load, text_field, name))


def hf_stream_opener(
    first: Any, load: Callable[[], Any], text_field: str, name: str
) -> Callable[[Any, int], Iterator[tuple[str, Any]]]:
    """`open_stream` for a streamed `datasets.IterableDataset`: resumes from the library's own
    iterator state where it has one, else by skipping `index` records."""
    opened = [first]

    def open_stream(stream_state: Any, index: int) -> Iterator[tuple[str, Any]]:
        data = opened.pop() if opened else load()
        resumable = hasattr(data, "state_dict") and hasattr(data, "load_state_dict")
        if stream_state is not None and resumable:
            data.load_state_dict(copy.deepcopy(stream_state))
        elif index:
            data = data.skip(index)
        for record in data:
            yield text_of(record, text_field, name), data.state_dict() if resumable else None

    return open_stream
