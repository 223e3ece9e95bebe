"""Hugging Face model folders on disk: config.json and safetensors weights, single or sharded.

Reading is lazy: `index_weights` reads the files' headers only (names, shapes, dtypes), so
shapes are checked before any weight is loaded, and `read_weight` reads one tensor, opening its
file for it alone. safetensors maps a file and gives tensors over the mapping; the pages a
tensor touched stay resident while the file is open, so a handle kept open over a whole
conversion would end up holding every tensor read through it. Writing follows transformers' layout: `model.safetensors`,
or `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` above a shard size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.progress import progress

CONFIG_NAME = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 5 * 2**30
"""Largest safetensors file written (transformers' default is 5 GB too)."""


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def _dtype(name: str, key: str) -> torch.dtype:
    """The torch dtype of safetensors' dtype name (a file header's)."""
    if name not in _DTYPES:
        raise CheckpointFormatError(f"{key!r} is stored as {name}, which kenotron does not read; "
                                    f"convert the folder to float32, bfloat16 or float16")
    return _DTYPES[name]


def _safetensors() -> Any:
    try:
        import safetensors.torch  # optional package (the hf extra): only Hugging Face folders need it
    except ImportError:
        raise CheckpointFormatError("Hugging Face folders need safetensors; pip install 'kenotron[hf]'") from None
    return safetensors


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    path = Path(hf_dir) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointFormatError(
            f"{hf_dir} has no {CONFIG_NAME}; point at a Hugging Face model folder (config.json + *.safetensors)"
        )
    return json.loads(path.read_text())


def weight_files(hf_dir: str | Path) -> dict[str, Path]:
    """{HF key: file holding it} from the index of a sharded folder, or from its single file."""
    hf_dir = Path(hf_dir)
    index = hf_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {key: hf_dir / name for key, name in weight_map.items()}
        missing = sorted({f.name for f in files.values() if not f.is_file()})
        if missing:
            raise CheckpointFormatError(f"{index} lists {missing[0]}, which is missing; download the whole folder")
        return files
    single = hf_dir / SINGLE_FILE
    if single.is_file():
        safetensors = _safetensors()
        with safetensors.safe_open(str(single), framework="pt") as f:
            # safe_open is not a mapping: it has keys() but no __iter__ / __contains__.
            return dict.fromkeys(f.keys(), single)
    found = sorted(p.name for p in hf_dir.glob("*.bin")) or sorted(p.name for p in hf_dir.iterdir())[:5]
    raise CheckpointFormatError(
        f"{hf_dir} holds no {SINGLE_FILE} or {INDEX_FILE} (found: {', '.join(found) or 'nothing'}); kenotron reads "
        f"safetensors only: save the model with transformers' save_pretrained(safe_serialization=True)"
    )


@dataclass(frozen=True)
class StoredWeight:
    """Where an HF tensor is and what it is, from its file's header."""

    path: Path
    shape: tuple[int, ...]
    dtype: torch.dtype


def index_weights(hf_dir: str | Path) -> dict[str, StoredWeight]:
    """{HF key: StoredWeight} of the folder's weights, in its index's order; reads no tensor."""
    safetensors = _safetensors()
    files = weight_files(hf_dir)
    stored: dict[str, StoredWeight] = {}
    for path in sorted(set(files.values())):
        with safetensors.safe_open(str(path), framework="pt") as f:
            names = f.keys()  # safe_open is not a mapping: it has keys() but no __iter__
            for key in names:
                piece = f.get_slice(key)
                stored[key] = StoredWeight(path, tuple(piece.get_shape()), _dtype(piece.get_dtype(), key))
    missing = [key for key in files if key not in stored]
    if missing:
        raise CheckpointFormatError(f"{files[missing[0]]} lacks {missing[0]!r}, which the folder's index lists "
                                    f"there; download the whole folder again")
    return {key: stored[key] for key in files}


def read_weight(key: str, stored: StoredWeight) -> torch.Tensor:
    """The tensor `key`, its file opened for it alone (module docstring): once the tensor is
    dropped, nothing of the file stays in this process's memory."""
    with _safetensors().safe_open(str(stored.path), framework="pt") as f:
        return f.get_tensor(key)


def plan_shards(nbytes: Mapping[str, int], max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[list[str]]:
    """Keys grouped into safetensors files of at most `max_shard_bytes` (a larger tensor alone), in order."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, n in nbytes.items():
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n
    return shards


def write_hf_shards(
    out_dir: str | Path, config: Mapping[str, Any], shards: Sequence[Sequence[str]],
    load: Callable[[Sequence[str]], Mapping[str, torch.Tensor]], *, desc: str = "writing safetensors",
) -> Path:
    """Write config.json and the weights one shard at a time: `load(keys)` returns that shard's
    tensors, so no more than one shard is in memory (beyond what `load` keeps itself)."""
    safetensors = _safetensors()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps(dict(config), indent=2) + "\n")
    names = [SINGLE_FILE] if len(shards) == 1 else [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
    ]
    weight_map, total = {}, 0
    for name, keys in progress(list(zip(names, shards)), desc=desc, unit="file"):
        # safetensors refuses views and shared storage: give each tensor its own contiguous copy.
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in load(keys).items()}
        safetensors.torch.save_file(tensors, str(out / name), metadata={"format": "pt"})
        _readable_like_the_rest(out / name)
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out


def _readable_like_the_rest(path: Path) -> None:
    """safetensors creates its files private (0600); an exported folder's files get the mode the
    process's umask gives the others (config.json: 0644 under the usual umask 022)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def write_hf_folder(
    out_dir: str | Path, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write config.json and the weights (sharded above `max_shard_bytes`); returns the folder."""
    nbytes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards = plan_shards(nbytes, max_shard_bytes)
    return write_hf_shards(out_dir, config, shards, lambda keys: {k: tensors[k] for k in keys})
