"""Models to generate from: a kenotron flavor built here (random weights), a kenotron
checkpoint step folder (the model it records, its weights through DCP), or a Hugging Face
folder (kenotron.checkpoint.hf.load_hf_model, through the family's HF adapter).

Nothing is downloaded: folders must be on disk.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch
from torch import nn

from kenotron.checkpoint.folders import check_checkpoint
from kenotron.checkpoint.hf import load_hf_model
from kenotron.checkpoint.model_info import model_from_info
from kenotron.checkpoint.trust import load_state
from kenotron.models import get_model_spec

__all__ = ["build_kenotron_model", "load_checkpoint_model", "load_hf_model"]


def _cast_parameters(model: nn.Module, dtype: torch.dtype | None) -> None:
    # Parameters only: the RoPE tables stay fp32 (a bf16 table loses precision at long positions).
    if dtype is not None:
        for param in model.parameters():
            param.data = param.data.to(dtype)


def build_kenotron_model(
    name: str, flavor: str, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
    max_seq_len: int = 0, vocab_size: int = 0, seed: int = 0,
) -> nn.Module:
    """A freshly initialized kenotron model of a registered family and flavor."""
    spec = get_model_spec(name)
    args = spec.model_args(flavor, max_seq_len=max_seq_len, vocab_size=vocab_size)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device=device)
    model.init_weights(buffer_device=device, seed=seed)
    _cast_parameters(model, dtype)
    return model.eval()


def load_checkpoint_model(
    step_folder: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
    max_seq_len: int = 0,
) -> nn.Module:
    """The model a kenotron checkpoint step folder (full or model-only) was saved from, with its
    weights, in one process. The family and dimensions come from the folder's completion marker;
    `max_seq_len` (0: as saved) sizes the RoPE tables."""
    marker, _ = check_checkpoint(step_folder)
    spec, args = model_from_info(marker.get("model"), str(step_folder))
    if max_seq_len:
        args = dataclasses.replace(args, max_seq_len=max_seq_len)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device=device)
    model.init_buffers(device)
    state = model.state_dict()
    if args.tie_embeddings:
        state.pop("output.weight", None)  # the same tensor as the embedding, which is loaded
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process is the intent
        load_state({"model": state}, step_folder, no_dist=True)
    _cast_parameters(model, dtype)
    return model.eval()
