"""`open_documents(dataset, path, ...)`: the document source that `data.dataset` names, one of

- "builtin": the built-in corpus (kenotron.data.corpus), no download, no `datasets` import;
- "json", "jsonl", "parquet", "text", or "auto" (format from the file extension): local
  file(s) or a folder at `data.path`, read by kenotron itself (kenotron.data.local_files; no
  `datasets` needed). Text files give one document per paragraph (blank-line separated);
  json/jsonl/parquet records give one document each (column `data.text_field`);
- anything else: a Hugging Face hub dataset name, `data.path` being its config name, streamed
  through `datasets` (nothing downloaded up front; text_source.py).
"""

from __future__ import annotations

from kenotron.data.corpus import builtin_documents
from kenotron.data.local_files import open_local_documents
from kenotron.data.text_source import LOCAL_FORMATS, DocumentSource, list_documents, open_hub_documents
from kenotron.errors import DataError


def open_documents(dataset: str, path: str = "", text_field: str = "text", split: str = "train",
                   key: str = "data.path") -> DocumentSource:
    """The documents named by `data.dataset` and `data.path` (see the module docstring; `key`:
    the config key that holds the path, named by errors)."""
    if dataset == "builtin":
        return list_documents("the built-in corpus", builtin_documents())
    if dataset in LOCAL_FORMATS or dataset == "auto":
        return open_local_documents(dataset, path, text_field, key)
    if not dataset:
        raise DataError(
            "data.dataset is empty; use 'builtin', 'tokenized', a local format (json, jsonl, parquet, text, "
            "auto) with data.path, or a hub dataset name"
        )
    return open_hub_documents(dataset, path, text_field, split)
