"""Hugging Face model folders on disk: config.json and safetensors weights, single or sharded.

Reading is lazy (`safe_open` maps the files; a tensor is read when asked for), so shapes can be
checked before any weight is loaded. Writing follows transformers' layout: `model.safetensors`,
or `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` above a shard size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
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


def _safetensors() -> Any:
    try:
        import safetensors.torch
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


@contextmanager
def open_weights(hf_dir: str | Path) -> Iterator[dict[str, Any]]:
    """{HF key: lazy slice}; `.get_shape()` reads no data, `[:]` reads the tensor."""
    safetensors = _safetensors()
    files = weight_files(hf_dir)
    with ExitStack() as stack:
        handles = {path: stack.enter_context(safetensors.safe_open(str(path), framework="pt"))
                   for path in set(files.values())}
        yield {key: handles[path].get_slice(key) for key, path in files.items()}


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
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out


def write_hf_folder(
    out_dir: str | Path, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write config.json and the weights (sharded above `max_shard_bytes`); returns the folder."""
    nbytes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards = plan_shards(nbytes, max_shard_bytes)
    return write_hf_shards(out_dir, config, shards, lambda keys: {k: tensors[k] for k in keys})
