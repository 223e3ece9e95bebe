"""Hugging Face interop: transformers folders in and out of kenotron, under any parallel plan.

    model = load_hf_model("Llama-3.2-1B")            # family and dimensions from config.json
    load_hf_weights([model], hf_dir)                 # into a model built and parallelized yourself
    save_hf(model, hf_dir_out)                       # any layout: gathered to rank 0, written there
    hf_to_checkpoint(hf_dir, "ckpt")                 # a DCP model-only checkpoint (ckpt/step-000000)
    checkpoint_to_hf("ckpt/step-000100", hf_dir_out) # from a trainer checkpoint, without building a model

The DCP route is the one for large models: `hf_to_checkpoint` once, then train with
`--checkpoint.initial_load_path ckpt/step-000000`, and DCP gives each rank its own shard under
whatever plan the run uses. Both conversions stream, one tensor at a time (hf_to_checkpoint:
checkpoint/hf_import.py; checkpoint_to_hf: one safetensors file at a time), so neither needs
the model in host memory. Key and config translation is the family's adapter (models/*/hf.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.checkpoint.folders import check_checkpoint
from kenotron.checkpoint.hf_files import (
    DEFAULT_SHARD_BYTES,
    plan_shards,
    read_hf_config,
    write_hf_folder,
    write_hf_shards,
)
from kenotron.checkpoint.hf_import import (
    HFWeights,
    check_config_fits_weights,
    check_memory,
    hf_to_checkpoint,
    spec_for_hf_config,
)
from kenotron.checkpoint.hf_tokenizer import write_hf_tokenizer
from kenotron.checkpoint.model_info import model_from_info
from kenotron.checkpoint.trust import load_state
from kenotron.models import MODEL_SPECS, ModelSpec

__all__ = ["checkpoint_to_hf", "hf_to_checkpoint", "load_hf_model", "load_hf_weights", "read_hf_state_dict", "save_hf",
           "spec_for_hf_config"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def read_hf_state_dict(hf_dir: str | Path, spec: ModelSpec, args: Any, expected: Mapping[str, torch.Size]) -> dict:
    """The folder's weights under kenotron names, all in memory, after checking them against
    `expected` ({kenotron name: global shape}): the first missing, extra or mismatching parameter is named."""
    weights = HFWeights(hf_dir, spec, args)
    weights.check(expected)
    return {key: weights.tensor(key) for key in weights.sources}


def load_hf_weights(model_parts: Sequence[nn.Module], hf_dir: str | Path) -> None:
    """Load a Hugging Face folder into model parts built from its config.json and parallelized
    in any way (FSDP, TP DTensors, pipeline stages holding some of the names). Collective: every
    rank calls it; rank 0 reads the files and the weights are broadcast and sharded from there."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config)
    check_config_fits_weights(hf_dir, spec, args)
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
    max_position_embeddings) sizes the RoPE tables. The weights are copied in one tensor at a
    time: the model and one converted tensor are in memory, never a second copy of the model."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config, max_seq_len=max_seq_len)
    stored = check_config_fits_weights(hf_dir, spec, args)
    check_memory(hf_dir, stored, torch.finfo(torch.float32).bits // 8, device)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device=device)
    model.init_buffers(device)
    targets = model.state_dict()
    weights = HFWeights(hf_dir, spec, args)
    weights.check({k: v.shape for k, v in targets.items()})  # every key of the model, and no other
    with torch.no_grad():
        for key, target in targets.items():
            target.copy_(weights.tensor(key))
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
    # HF name -> (kenotron name, HF shape); a tied output is left out, stacked experts give one name per expert.
    kept = {hf: (k, shape) for k, (size, _) in stored.items() for hf, shape in adapter.hf_names(k, tuple(size), args).items()}
    itemsize = {k: (dtype or d).itemsize for k, (_, d) in stored.items()}
    nbytes = {hf: torch.Size(shape).numel() * itemsize[k] for hf, (k, shape) in kept.items()}

    def load(hf_keys: Any) -> dict[str, torch.Tensor]:
        names = {kept[h][0] for h in hf_keys}
        state = {k: torch.empty(stored[k][0], dtype=stored[k][1]) for k in names}
        load_state({"model": state}, checkpoint_dir, no_dist=True)
        tensors = adapter.to_hf(state, args)
        tensors = {h: tensors[h] for h in hf_keys}
        return {k: v.to(dtype) for k, v in tensors.items()} if dtype is not None else tensors

    unexported = [k for k, (size, _) in stored.items() if not adapter.hf_names(k, tuple(size), args)
                  and not (args.tie_embeddings and k == "output.weight")]
    if unexported:  # keys HF lacks (an MoE router's bias): to_hf refuses them unless zero
        state = {k: torch.empty(stored[k][0], dtype=stored[k][1]) for k in unexported}
        load_state({"model": state}, checkpoint_dir, no_dist=True)
        adapter.to_hf(state, args)

    out_dtype = dtype or next(iter(stored.values()))[1]
    config = {**adapter.hf_config_from_args(args), "torch_dtype": str(out_dtype).removeprefix("torch.")}
    if tokenizer is not None:
        config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
    out = write_hf_shards(out_dir, config, plan_shards(nbytes, max_shard_bytes), load)
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, out)
    return out
