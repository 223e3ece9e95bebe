"""Reading a checkpoint without running code from it.

DCP reads three kinds of data, and plain DCP trusts all of them:

- `.metadata` (the index) is read with `pickle.load`, which runs any callable the file names;
  here it goes through an unpickler that only builds the classes DCP's metadata is made of;
- non-tensor values (e.g. the optimizer's hyperparameters) are read with
  `torch.load(weights_only=False)`; here with `weights_only=True` (containers, numbers,
  strings, tensors only);
- tensors are already read with `torch.load(weights_only=True)`.

kenotron's own state is stored as tensors and JSON (state.py). So loading a checkpoint through
`load_state` / `read_metadata` builds data, never runs code. What a checkpoint folder must still
be trusted for (its values, e.g. weights chosen by an attacker) is in docs/checkpointing.md.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.serialization
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta

from kenotron.checkpoint.diagnose import is_checkpoint_exception, root_causes
from kenotron.checkpoint.errors import CheckpointError, CheckpointFormatError

METADATA_NAME = ".metadata"

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_PLAIN = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a layout from its name
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("pathlib", "WindowsPath"): pathlib.PureWindowsPath,  # read back as a plain path, never opened
    ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
    ("collections", "OrderedDict"): __import__("collections").OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes (dataclasses and enums of its metadata modules), torch
    sizes, dtypes and layouts, paths and plain containers; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return _PLAIN[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        if module in _DCP_MODULES and not name.startswith("__"):
            value = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)):
                return value
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: DCP metadata never holds it")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing a persistent id: DCP metadata never holds one")


def read_metadata(path: str | Path, rank: int | None = None) -> Any:
    """DCP's `Metadata` of a checkpoint folder, built by MetadataUnpickler.

    CheckpointFormatError when the file is missing, truncated, or names anything that DCP's
    metadata never holds (a crafted file).
    """
    name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
    file = Path(path) / name
    if not file.is_file():
        raise CheckpointFormatError(
            f"{path} has no {name}: the folder is truncated or not a DCP checkpoint; load an earlier step or "
            f"restore the file"
        )
    try:
        with open(file, "rb") as f:
            return MetadataUnpickler(f).load()
    except pickle.UnpicklingError as exc:
        if "refusing" in str(exc):
            raise CheckpointFormatError(
                f"{file} is not plain DCP metadata ({exc}); it may have been crafted to run code when loaded. "
                f"Do not load this checkpoint; restore it from a copy you trust"
            ) from None
        raise CheckpointFormatError(
            f"{file} cannot be read ({type(exc).__name__}: {exc}); the folder is truncated or damaged, load an "
            f"earlier step"
        ) from None
    except (EOFError, AttributeError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise CheckpointFormatError(
            f"{file} cannot be read ({type(exc).__name__}: {exc}); the folder is truncated or damaged, load an "
            f"earlier step"
        ) from None


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata goes through MetadataUnpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        metadata = read_metadata(self.path, kwargs.get("rank"))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor values with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            plain = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            text = str(exc)
            why = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                        if line.startswith("WeightsUnpickler error:")), text.strip().splitlines()[0])
            raise CheckpointFormatError(
                f"checkpoint entry {read_item.dest_index.fqn!r} holds more than plain values ({why}); it may have "
                f"been crafted to run code when loaded. Do not load this checkpoint"
            ) from None
        # DCP's own method places the value (it differs between torch versions); what it unpickles
        # is this re-serialization of already-checked plain data.
        again = io.BytesIO()
        torch.save(plain, again)
        again.seek(0)
        super().load_bytes(read_item, again)


def load_state(state: dict[str, Any], path: str | Path, *, process_group: dist.ProcessGroup | None = None,
               no_dist: bool = False) -> None:
    """`dcp.load(state, path)` through SafeFileSystemReader and SafeLoadPlanner; a failure is a
    CheckpointFormatError saying which rank failed and why (DCP's own exception is a BaseException)."""
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(),
                 process_group=process_group, no_dist=no_dist)
    except BaseException as exc:
        if not is_checkpoint_exception(exc):
            raise
        causes = root_causes(exc)
        ours = next((c for c in causes.values() if isinstance(c, CheckpointError)), None)
        if ours is not None:
            raise ours from None
        rank, cause = next(iter(causes.items()))
        on = f" on rank {rank}" if rank is not None else ""
        first_line = (str(cause).strip().splitlines() or ["no details"])[0]
        raise CheckpointFormatError(
            f"loading {path} failed{on}: {type(cause).__name__}: {first_line}; the folder is damaged or was written "
            f"by other code, load an earlier step"
        ) from None
