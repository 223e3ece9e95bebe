"""Hugging Face interop: transformers folders in and out of kenotron, under any parallel plan.

    model = load_hf_model("Llama-3.2-1B")            # family and dimensions from config.json
    load_hf_weights([model], hf_dir)                 # into a model built and parallelized yourself
    save_hf(model, hf_dir_out)                       # any layout: gathered to rank 0, written there
    hf_to_checkpoint(hf_dir, "ckpt")                 # a DCP model-only checkpoint (ckpt/step-000000)
    checkpoint_to_hf("ckpt/step-000100", hf_dir_out) # from a trainer checkpoint, without building a model

The DCP route is the one for large models: `hf_to_checkpoint` once, then train with
`--checkpoint.initial_load_path ckpt/step-000000`, and DCP gives each rank its own shard under
whatever plan the run uses. Key and config translation is the family's adapter (models/*/hf.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from kenotron.checkpoint.errors import CheckpointFormatError, CheckpointMismatchError
from kenotron.checkpoint.folders import check_checkpoint, step_folder_name, write_marker
from kenotron.checkpoint.hf_files import (
    DEFAULT_SHARD_BYTES,
    open_weights,
    plan_shards,
    read_hf_config,
    write_hf_folder,
    write_hf_shards,
)
from kenotron.checkpoint.hf_tokenizer import write_hf_tokenizer
from kenotron.checkpoint.model_info import describe_model, model_from_info
from kenotron.checkpoint.trust import load_state
from kenotron.models import MODEL_SPECS, ModelSpec


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


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def read_hf_state_dict(hf_dir: str | Path, spec: ModelSpec, args: Any, expected: Mapping[str, torch.Size]) -> dict:
    """The folder's weights under kenotron names, after checking them against `expected`
    ({kenotron name: global shape}): the first missing, extra or mismatching parameter is named."""
    adapter = spec.hf_adapter
    with open_weights(hf_dir) as slices:
        shapes = {}
        for hf_key, tensor_slice in slices.items():
            if not adapter.is_ignored_hf_key(hf_key):
                shapes[adapter.from_hf_key(hf_key)] = tuple(tensor_slice.get_shape())
        if args.tie_embeddings:
            shapes.pop("output.weight", None)  # HF may store the tied copy too; the embedding is the one
        wanted = {k: tuple(v) for k, v in expected.items() if not (args.tie_embeddings and k == "output.weight")}
        for key, shape in wanted.items():
            if key not in shapes:
                raise CheckpointMismatchError(
                    f"{hf_dir} has no weight for parameter {key!r} ({adapter.to_hf_key(key)!r}); its config.json "
                    f"does not describe its weights, or the download is incomplete"
                )
            if shapes[key] != shape:
                raise CheckpointMismatchError(
                    f"parameter {key!r} ({adapter.to_hf_key(key)!r}) has shape {shapes[key]} in {hf_dir} but {shape} "
                    f"in the model here; build the model from that folder's config.json"
                )
        extra = [k for k in shapes if k not in wanted]
        if extra:
            raise CheckpointMismatchError(
                f"{hf_dir} holds {adapter.to_hf_key(extra[0])!r}, which the model here lacks; build the model from "
                f"that folder's config.json"
            )
        hf_state = {k: s[:] for k, s in slices.items() if not adapter.is_ignored_hf_key(k)}
    return adapter.from_hf(hf_state, args)


def load_hf_weights(model_parts: Sequence[nn.Module], hf_dir: str | Path) -> None:
    """Load a Hugging Face folder into model parts built from its config.json and parallelized
    in any way (FSDP, TP DTensors, pipeline stages holding some of the names). Collective: every
    rank calls it; rank 0 reads the files and the weights are broadcast and sharded from there."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config)
    distributed = _distributed()
    expected: dict[str, torch.Size] = {}
    for part in model_parts:
        expected.update({k: v.shape for k, v in get_model_state_dict(part).items()})
    state = read_hf_state_dict(hf_dir, spec, args, expected) if not distributed or dist.get_rank() == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=False)
    for part in model_parts:
        set_model_state_dict(part, state, options=options)


def load_hf_model(hf_dir: str | Path, *, max_seq_len: int = 0, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> nn.Module:
    """A ready kenotron model (one process) from a transformers folder: the family and the
    dimensions come from its config.json. `max_seq_len` (0: the config's
    max_position_embeddings) sizes the RoPE tables."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config, max_seq_len=max_seq_len)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device=device)
    model.init_buffers(device)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    state = read_hf_state_dict(hf_dir, spec, args, expected)
    model.load_state_dict(state, strict=True)
    return model.to(dtype=dtype) if dtype != torch.float32 else model


def save_hf(model: nn.Module, out_dir: str | Path, *, spec: ModelSpec | None = None, args: Any = None,
            dtype: torch.dtype | None = None, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Write `model` (any layout; collective) as a transformers folder from rank 0. `spec` and
    `args` default to the family whose model class built it and `model.args`."""
    args = args if args is not None else model.args
    spec = spec or next((s for s in MODEL_SPECS.values() if isinstance(model, s.model_cls)), None)
    if spec is None or spec.hf_adapter is None:
        raise CheckpointFormatError(f"{type(model).__name__} has no Hugging Face adapter; pass spec= explicitly")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _distributed() and dist.get_rank() != 0:
        return Path(out_dir)
    return _write(full, spec, args, out_dir, dtype, max_shard_bytes)


def _write(state: Mapping[str, torch.Tensor], spec: ModelSpec, args: Any, out_dir: str | Path,
           dtype: torch.dtype | None, max_shard_bytes: int) -> Path:
    tensors = spec.hf_adapter.to_hf(state, args)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    config = {**spec.hf_adapter.hf_config_from_args(args), "torch_dtype": str(next(iter(tensors.values())).dtype)[6:]}
    return write_hf_folder(out_dir, config, tensors, max_shard_bytes)


def hf_to_checkpoint(hf_dir: str | Path, out_folder: str | Path, *, step: int = 0, dtype: torch.dtype | None = None,
                     max_seq_len: int = 0) -> Path:
    """Convert a transformers folder into a DCP model-only checkpoint `out_folder/step-NNNNNN`
    (one process), loadable under any plan with checkpoint.initial_load_path."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config, max_seq_len=max_seq_len)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in spec.build(args).state_dict().items()}
    state = read_hf_state_dict(hf_dir, spec, args, expected)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    path = Path(out_folder) / step_folder_name(step)
    path.mkdir(parents=True, exist_ok=True)
    dcp.save({"model": state}, checkpoint_id=str(path), no_dist=True)
    stored = str(next(iter(state.values())).dtype).removeprefix("torch.")
    write_marker(path, {
        "step": step, "parts": ["model"], "model_only": True, "dtype": stored, "world_size": 1,
        "model": describe_model(spec, args), "torch": torch.__version__, "source": str(hf_dir),
    })
    return path


def checkpoint_to_hf(checkpoint_dir: str | Path, out_dir: str | Path, *, dtype: torch.dtype | None = None,
                     max_shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer: Any = None) -> Path:
    """Convert a kenotron checkpoint step folder (full or model-only) into a transformers folder,
    in one process, without building the model: the weights' shapes come from DCP's metadata and
    the family and dimensions from the completion marker. The weights stream one safetensors
    file at a time (no full copy of the model in memory). With `tokenizer` (a kenotron tokenizer)
    its files and generation_config.json (BOS/EOS) are written too."""
    marker, metadata = check_checkpoint(checkpoint_dir)
    spec, args = model_from_info(marker.get("model"), str(checkpoint_dir))
    adapter = spec.hf_adapter
    stored = {}  # kenotron name -> (shape, stored dtype), in checkpoint order
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(item, "size"):
            stored[key.removeprefix("model.")] = (item.size, item.properties.dtype)
    kept = adapter.to_hf({k: k for k in stored}, args)  # HF name -> kenotron name (tied output left out)
    itemsize = {k: (dtype or d).itemsize for k, (_, d) in stored.items()}
    nbytes = {hf: torch.Size(stored[k][0]).numel() * itemsize[k] for hf, k in kept.items()}

    def load(hf_keys: Any) -> dict[str, torch.Tensor]:
        state = {kept[h]: torch.empty(stored[kept[h]][0], dtype=stored[kept[h]][1]) for h in hf_keys}
        load_state({"model": state}, checkpoint_dir, no_dist=True)
        tensors = adapter.to_hf(state, args)
        return {k: v.to(dtype) for k, v in tensors.items()} if dtype is not None else tensors

    out_dtype = dtype or next(iter(stored.values()))[1]
    config = {**adapter.hf_config_from_args(args), "torch_dtype": str(out_dtype).removeprefix("torch.")}
    if tokenizer is not None:
        config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
    out = write_hf_shards(out_dir, config, plan_shards(nbytes, max_shard_bytes), load)
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, out)
    return out
