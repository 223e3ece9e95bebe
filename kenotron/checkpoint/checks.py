"""Does a checkpoint fit what it is about to be loaded into? Checked before DCP reads a byte.

DCP itself reports a missing key as "Missing key in checkpoint state_dict" and may report a
shape mismatch as an error deep in its read planner. Comparing our state dict with the
checkpoint's metadata first gives one clear message naming the first parameter that differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kenotron.checkpoint.errors import CheckpointMismatchError


def flatten_state_dict(state: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts (and lists holding tensors or dicts) into DCP's dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_state_dict(value, name + "."))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, torch.Tensor)) for v in value):
            flat.update(flatten_state_dict({str(i): v for i, v in enumerate(value)}, name + "."))
        else:
            flat[name] = value
    return flat


def check_same_family(saved: Any, ours: Mapping[str, Any], path: str | Path) -> None:
    """Raise CheckpointMismatchError when the checkpoint's model (its marker's model info) is of
    another family than the model here (`ours`: this run's model info)."""
    if not isinstance(saved, Mapping) or not saved.get("name") or not ours.get("name"):
        return
    if saved["name"] != ours["name"]:
        flavor = f" {saved['flavor']}" if saved.get("flavor") else ""
        raise CheckpointMismatchError(
            f"checkpoint {path} holds a {saved['name']}{flavor} model but this run builds {ours['name']}; set "
            f"model.name = {saved['name']!r} (and its flavor) to continue it, or load a {ours['name']} checkpoint"
        )


def check_state_fits(
    state_dict: Mapping[str, Any], metadata: Any, path: str | Path, model_info: str = "",
    model_keys: set[str] | None = None,
) -> None:
    """Raise CheckpointMismatchError unless every entry of `state_dict` is in the checkpoint with
    the same shape, and the checkpoint's model has no parameter that the model here lacks.

    `state_dict` is keyed by part ("model", "optimizer", ...) as passed to DCP; tensors may be
    DTensors (their global shape is compared). `model_info` describes the saved model for the
    message (from the completion marker). `model_keys`: the "model." keys of the whole model
    when this rank holds only some of it (pipeline stages); default: those of `state_dict`.
    """
    stored = metadata.state_dict_metadata
    flat = flatten_state_dict(state_dict)
    saved_as = f" (saved with {model_info})" if model_info else ""
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor) or key not in stored:
            continue
        stored_size = getattr(stored[key], "size", None)
        if stored_size is None:
            raise CheckpointMismatchError(
                f"{_describe(key)} is a tensor here but a Python object in checkpoint {path}; it was written by "
                f"different code. Exclude its part with checkpoint.exclude_from_loading"
            )
        if tuple(stored_size) != tuple(value.shape):
            count = sum(
                1 for k, v in flat.items()
                if isinstance(v, torch.Tensor) and k in stored and tuple(getattr(stored[k], "size", ())) != tuple(v.shape)
            )
            more = f" (first of {count} mismatching tensors)" if count > 1 else ""
            raise CheckpointMismatchError(
                f"{_describe(key)} has shape {tuple(stored_size)} in checkpoint {path}{saved_as} but "
                f"{tuple(value.shape)} here{more}. {_dimension_hint(key, tuple(stored_size), tuple(value.shape))}"
            )
    missing = [k for k in flat if k not in stored and not any(s.startswith(k + ".") for s in stored)]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        if all(k.startswith("optimizer.") and k.endswith(".master") for k in missing):
            raise CheckpointMismatchError(
                f"checkpoint {path}{saved_as} has no {_describe(missing[0])}{more}: it was saved without master "
                f"weights (tuning.mixed_precision). Resume with the mixed precision it was saved with, or start "
                f"the optimizer fresh from its weights with checkpoint.exclude_from_loading = optimizer"
            )
        raise CheckpointMismatchError(
            f"checkpoint {path}{saved_as} has no {_describe(missing[0])}{more}. It was saved from another model "
            f"or another code version; build the same model, or leave the part out with "
            f"checkpoint.exclude_from_loading"
        )
    ours = model_keys if model_keys is not None else {k for k in flat if k.startswith("model.")}
    if ours:
        extra = [k for k in stored if k.startswith("model.") and k not in ours]
        if extra:
            more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
            raise CheckpointMismatchError(
                f"checkpoint {path}{saved_as} has {_describe(extra[0])}{more} that the model here lacks; build "
                f"the model with the layers and dimensions it was saved with (model.n_layers, model.flavor)"
            )


def _dimension_hint(key: str, stored: tuple, ours: tuple) -> str:
    """The fix for a shape mismatch: the expert count of an MoE layer, else the model's dimensions."""
    expert_tensor = ".experts." in key or key.endswith(("router.gate.weight", "router.expert_bias"))
    if expert_tensor and stored and ours and stored[0] != ours[0]:
        return (f"The checkpoint's MoE layers have {stored[0]} experts, the model here {ours[0]}: set "
                f"model.moe.n_experts={stored[0]}")
    return "Build the model with the dimensions it was saved with (model.flavor, model.vocab_size, model.n_layers)"


def _describe(key: str) -> str:
    part, _, rest = key.partition(".")
    if part == "model":
        return f"parameter {rest!r}"
    if part == "optimizer":
        return f"optimizer entry {rest!r}"
    return f"entry {key!r}"
