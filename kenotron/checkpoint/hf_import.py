"""Hugging Face folder -> kenotron names, one tensor at a time; the streamed HF -> DCP conversion.

    weights = HFWeights(hf_dir, spec, args)         # names, shapes and dtypes: no tensor read yet
    weights.check(expected)                         # against {kenotron key: shape} of a model
    weights.tensor("layers.0.attention.wq.weight")  # the HF tensors it needs read, converted
    hf_to_checkpoint(hf_dir, "ckpt")                # ckpt/step-000000, a DCP model-only checkpoint

`hf_to_checkpoint` never holds the model. It plans the DCP save from meta tensors (the
conversion run on shapes and dtypes alone), then writes DCP's usual single file per rank
(`__0_0.distcp`, the bytes torch's FileSystemWriter writes) one tensor after the other: each
is built when it is written (the planner's `lookup_object`) from the HF tensors it needs,
each read from whichever shard holds it (hf_files.read_weight), and dropped once written.
The peak host memory is therefore the tensor being written and what it is built from: its one
HF tensor for a renamed tensor (plus the copy that `--dtype` or Mamba-2's row regrouping
makes), or a stacked expert tensor and one expert's parts (plus a `--dtype` copy): the largest
kenotron tensor, up to three times that with a cast to a wider dtype, never the model.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from kenotron.checkpoint.errors import CheckpointFormatError, CheckpointMismatchError
from kenotron.checkpoint.folders import step_folder_name, write_marker
from kenotron.checkpoint.hf_files import StoredWeight, index_weights, read_hf_config, read_weight
from kenotron.checkpoint.model_info import describe_model
from kenotron.models import MODEL_SPECS, ModelSpec
from kenotron.progress import progress


def spec_for_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """The registered family whose adapter converts this config.json (by model_type)."""
    model_type = config.get("model_type")
    known = {spec.hf_adapter.model_type: spec for spec in MODEL_SPECS.values() if spec.hf_adapter is not None}
    if model_type not in known:
        supported = ", ".join(f"{t} ({s.name})" for t, s in sorted(known.items()))
        raise CheckpointFormatError(
            f"config.json has model_type={model_type!r}, which kenotron cannot convert; supported: {supported}"
        )
    return known[model_type]


def check_config_fits_weights(hf_dir: str | Path, spec: ModelSpec, args: Any) -> dict[str, StoredWeight]:
    """CheckpointMismatchError, before anything is built, when config.json does not describe the
    folder's weights (read from the safetensors headers): its layer count, or the embedding's
    vocabulary and width. A config of 100,000 layers or a hidden size of a million would
    otherwise be built, on meta tensors or for real, for minutes before failing. Returns the index."""
    stored = index_weights(hf_dir)
    adapter = spec.hf_adapter
    layer = re.compile(rf"^{re.escape(adapter.hf_layer_prefix)}\.(\d+)\.")
    found = 1 + max((int(m.group(1)) for key in stored if (m := layer.match(key))), default=-1)
    if found != args.n_layers:
        raise CheckpointMismatchError(
            f"{hf_dir}: config.json describes {args.n_layers} layers but the weights hold {found} "
            f"({adapter.hf_layer_prefix}.0 to .{found - 1}); fix config.json or download the folder again"
        )
    embedding = adapter.to_hf_key("tok_embeddings.weight")
    if embedding in stored and stored[embedding].shape != (args.vocab_size, args.dim):
        raise CheckpointMismatchError(
            f"{hf_dir}: config.json describes a vocabulary of {args.vocab_size} and a width of {args.dim} but "
            f"{embedding} has shape {stored[embedding].shape}; fix config.json or download the folder again"
        )
    return stored


def check_memory(hf_dir: str | Path, stored: Mapping[str, StoredWeight], bytes_per_value: int,
                 device: str | torch.device = "cpu") -> None:
    """CheckpointFormatError when the model, at `bytes_per_value` bytes a value, cannot fit in the
    memory of `device` available now: the host's (Linux's MemAvailable) or the GPU's free memory;
    not checked where that is unknown."""
    needed = sum(math.prod(w.shape) for w in stored.values()) * bytes_per_value
    device = torch.device(device)
    where = "host memory"
    try:
        if device.type == "cuda":
            available, where = torch.cuda.mem_get_info(device)[0], f"memory on {device}"
        else:
            with open("/proc/meminfo") as f:
                available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, RuntimeError, StopIteration, ValueError, IndexError):
        return
    if needed > available:
        raise CheckpointFormatError(
            f"the model in {hf_dir} needs {needed / 2**30:.1f} GiB of {where} to load, {available / 2**30:.1f} "
            f"GiB are available; free memory, or convert it (kenotron convert to-kenotron, one tensor at a time) "
            f"and load it sharded over several processes"
        )


class HFWeights:
    """An HF folder's weights under kenotron names, each tensor built when asked for (module
    docstring). `sources` maps each kenotron key to the HF keys it is built from, `meta` to a
    meta tensor of its shape and dtype; both in the adapter's `from_hf` order."""

    def __init__(self, hf_dir: str | Path, spec: ModelSpec, args: Any) -> None:
        self.hf_dir, self.adapter, self.args = hf_dir, spec.hf_adapter, args
        self._stored = index_weights(hf_dir)
        self.sources = self.adapter.from_hf_sources(self._stored, args)
        self.meta = {k: self.adapter.from_hf_tensor(k, s, self._meta_read, args).to("meta")
                     for k, s in self.sources.items()}

    def _meta_read(self, hf_key: str) -> torch.Tensor:
        stored = self._stored[hf_key]
        return torch.empty(stored.shape, dtype=stored.dtype, device="meta")

    def _read(self, hf_key: str) -> torch.Tensor:
        return read_weight(hf_key, self._stored[hf_key])

    def tensor(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The kenotron tensor `key`, its HF tensors read now (and dropped when it is)."""
        tensor = self.adapter.from_hf_tensor(key, self.sources[key], self._read, self.args)
        return tensor if dtype is None else tensor.to(dtype)

    def check(self, expected: Mapping[str, torch.Size | tuple[int, ...]]) -> None:
        """CheckpointMismatchError naming the first parameter of `expected` ({kenotron key: global
        shape}) that the folder lacks or holds in another shape, or the first it holds beyond them."""
        adapter, tied = self.adapter, self.args.tie_embeddings
        # HF may store the tied copy too; the embedding is the one either way.
        shapes = {k: tuple(t.shape) for k, t in self.meta.items() if not (tied and k == "output.weight")}
        wanted = {k: tuple(v) for k, v in expected.items() if not (tied and k == "output.weight")}
        for key, shape in wanted.items():
            if key not in shapes:
                raise CheckpointMismatchError(
                    f"{self.hf_dir} has no weight for parameter {key!r} ({adapter.to_hf_key(key)!r}); its config.json "
                    f"does not describe its weights, or the download is incomplete"
                )
            if shapes[key] != shape:
                raise CheckpointMismatchError(
                    f"parameter {key!r} ({adapter.to_hf_key(key)!r}) has shape {shapes[key]} in {self.hf_dir} but "
                    f"{shape} in the model here; build the model from that folder's config.json"
                )
        extra = [k for k in shapes if k not in wanted]
        if extra:
            raise CheckpointMismatchError(
                f"{self.hf_dir} holds {adapter.to_hf_key(extra[0])!r}, which the model here lacks; build the model "
                f"from that folder's config.json"
            )


class _BuildOnWrite(DefaultSavePlanner):
    """A save planned from meta tensors whose real tensors are built when the writer asks for each."""

    def __init__(self, build: Callable[[str], torch.Tensor]) -> None:
        super().__init__()
        self._build = build

    def lookup_object(self, index: MetadataIndex) -> Any:
        planned = self.state_dict[index.fqn]
        tensor = self._build(index.fqn)
        if tensor.shape != planned.shape or tensor.dtype != planned.dtype:  # the metadata is already planned
            raise CheckpointFormatError(f"{index.fqn} was planned as {tuple(planned.shape)} {planned.dtype} but "
                                        f"converts to {tuple(tensor.shape)} {tensor.dtype}")
        return tensor


class _OneTensorAtATimeWriter(FileSystemWriter):
    """FileSystemWriter's layout and bytes (one file per rank, torch.save per tensor), written by
    a plain loop that drops each tensor once written: torch's own loop keeps every tensor it
    wrote until the file is closed, which is the whole model here. Each item's place (file,
    offset, length) is recorded as FileSystemReader reads it back: `_StorageInfo`, private in
    torch but with the same fields since DCP began."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file_name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        results = []
        with self.fs.create_stream(self.fs.concat_path(self.path, file_name), "wb") as stream:
            for item in progress(plan.items, desc="converting to a kenotron checkpoint", unit="tensor"):
                if item.type == WriteItemType.BYTE_IO:
                    raise CheckpointFormatError(f"{item.index.fqn} is not a tensor; a model checkpoint holds tensors only")
                tensor = planner.resolve_data(item).detach()
                if tensor.untyped_storage().nbytes() != tensor.nbytes:  # torch.save writes whole storages
                    tensor = tensor.clone()
                offset = stream.tell()
                torch.save(tensor, stream)
                del tensor
                length = stream.tell() - offset
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=_StorageInfo(file_name, offset, length)))
            if self.sync_files:
                stream.flush()
                os.fsync(stream.fileno())
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done


def hf_to_checkpoint(hf_dir: str | Path, out_folder: str | Path, *, step: int = 0, dtype: torch.dtype | None = None,
                     max_seq_len: int = 0) -> Path:
    """Convert a transformers folder into a DCP model-only checkpoint `out_folder/step-NNNNNN`
    (one process, streamed: see the module docstring), loadable under any plan with
    checkpoint.initial_load_path."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config, max_seq_len=max_seq_len)
    check_config_fits_weights(hf_dir, spec, args)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in spec.build(args).state_dict().items()}
    weights = HFWeights(hf_dir, spec, args)
    weights.check(expected)
    planned = {k: v if dtype is None else v.to(dtype) for k, v in weights.meta.items()}
    path = Path(out_folder) / step_folder_name(step)
    path.mkdir(parents=True, exist_ok=True)
    planner = _BuildOnWrite(lambda fqn: weights.tensor(fqn.removeprefix("model."), dtype))
    dcp.save({"model": planned}, storage_writer=_OneTensorAtATimeWriter(str(path)), planner=planner, no_dist=True)
    stored = str(next(iter(planned.values())).dtype).removeprefix("torch.")
    write_marker(path, {
        "step": step, "parts": ["model"], "model_only": True, "dtype": stored, "world_size": 1,
        "model": describe_model(spec, args), "torch": torch.__version__, "source": str(hf_dir),
    })
    return path
