"""Does a checkpoint fit what it is about to be loaded into? Checked before DCP reads a byte.

DCP itself reports a missing key as "Missing key in checkpoint state_dict" and may report a
shape mismatch as an error deep in its read planner. Comparing our state dict with the
checkpoint's metadata first gives one clear message naming the first parameter that differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kenotron.checkpoint.errors import CheckpointFormatError, CheckpointMismatchError
from kenotron.checkpoint.model_info import model_from_info

NOT_COMPARED = ("max_seq_len", "chunk_size", "a_init_range", "dt_init_range", "dt_init_floor")
"""Model settings a checkpoint may differ in from the run that loads it: the RoPE tables' length
(the run's training.seq_len), the SSD scan's chunking (the same result) and initialization only
(the weights come from the checkpoint)."""


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


def _flat_settings(args: Any, prefix: str = "") -> dict[str, Any]:
    """A model's args as {"rope_theta": 500000.0, "moe.n_experts": 8, ...} (nested dataclasses dotted)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flat_settings(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def setting_differences(saved: Any, ours: Mapping[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(key, the checkpoint's value, this run's) for every model setting that differs between the
    model a checkpoint recorded (its marker's model info) and this run's (`ours`); empty when
    either does not record its settings, or they are of different families (check_same_family)."""
    if not isinstance(saved, Mapping) or not ours or saved.get("name") != ours.get("name"):
        return []
    try:
        _, saved_args = model_from_info(dict(saved), "the checkpoint")
        _, our_args = model_from_info(dict(ours), "this run")
    except (CheckpointFormatError, KeyError, TypeError, ValueError):
        return []  # settings not recorded, or recorded by another version: the shapes are still checked
    theirs, mine = _flat_settings(saved_args), _flat_settings(our_args)
    return [(key, theirs.get(key), mine.get(key)) for key in dict.fromkeys([*theirs, *mine])
            if key.split(".")[0] not in NOT_COMPARED and theirs.get(key) != mine.get(key)]


def describe_differences(differences: list[tuple[str, Any, Any]]) -> str:
    """`the checkpoint's model has rope_theta=500000.0, this run's rope_theta=10000.0: set model.rope_theta=500000.0`."""
    saved = ", ".join(f"{k}={v!r}" for k, v, _ in differences)
    ours = ", ".join(f"{k}={v!r}" for k, _, v in differences)
    fix = ", ".join(f"model.{k}={v!r}" for k, v, _ in differences)
    return f"the checkpoint's model has {saved}, this run's {ours}: set {fix}"


def check_same_settings(differences: list[tuple[str, Any, Any]], path: str | Path) -> None:
    """CheckpointMismatchError naming every model setting (RoPE theta and scaling, norm eps, tied
    embeddings, window, ...) in which the checkpoint differs from this run's model: weights that
    fit in shape would otherwise load into a model that computes something else, silently."""
    if differences:
        raise CheckpointMismatchError(
            f"checkpoint {path} was saved from another model than this run builds: {describe_differences(differences)} "
            f"(TOML [model] or --model.<key>) to load it, or load a checkpoint of this model"
        )


def check_state_fits(
    state_dict: Mapping[str, Any], metadata: Any, path: str | Path, model_info: str = "",
    model_keys: set[str] | None = None, differences: list[tuple[str, Any, Any]] = (),
) -> None:
    """Raise CheckpointMismatchError unless every entry of `state_dict` is in the checkpoint with
    the same shape, and the checkpoint's model has no parameter that the model here lacks.

    `state_dict` is keyed by part ("model", "optimizer", ...) as passed to DCP; tensors may be
    DTensors (their global shape is compared). `model_info` describes the saved model for the
    message (from the completion marker). `model_keys`: the "model." keys of the whole model
    when this rank holds only some of it (pipeline stages); default: those of `state_dict`.
    `differences` (setting_differences) name the settings to change in place of a generic hint.
    """
    settings = f" ({describe_differences(list(differences))})" if differences else ""
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
                f"{tuple(value.shape)} here{more}. {_dimension_hint(key, tuple(stored_size), tuple(value.shape), differences)}"
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
            f"checkpoint {path}{saved_as} has no {_describe(missing[0])}{more}{settings}. It was saved from another "
            f"model or another code version; build the same model, or leave the part out with "
            f"checkpoint.exclude_from_loading"
        )
    ours = model_keys if model_keys is not None else {k for k in flat if k.startswith("model.")}
    if ours:
        extra = [k for k in stored if k.startswith("model.") and k not in ours]
        if extra:
            more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
            fix = (describe_differences(list(differences)) if differences else
                   "build the model with the layers and dimensions it was saved with (model.n_layers, model.flavor)")
            raise CheckpointMismatchError(
                f"checkpoint {path}{saved_as} has {_describe(extra[0])}{more} that the model here lacks; {fix}"
            )


def _dimension_hint(key: str, stored: tuple, ours: tuple, differences: list[tuple[str, Any, Any]] = ()) -> str:
    """The fix for a shape mismatch: the expert count of an MoE layer, else the settings known to
    differ (setting_differences), else the model's dimensions."""
    expert_tensor = ".experts." in key or key.endswith(("router.gate.weight", "router.expert_bias"))
    if expert_tensor and stored and ours and stored[0] != ours[0]:
        return (f"The checkpoint's MoE layers have {stored[0]} experts, the model here {ours[0]}: set "
                f"model.moe.n_experts={stored[0]}")
    if differences:
        text = describe_differences(list(differences))
        return text[0].upper() + text[1:]
    return "Build the model with the dimensions it was saved with (model.flavor, model.vocab_size, model.n_layers)"


def _describe(key: str) -> str:
    part, _, rest = key.partition(".")
    if part == "model":
        return f"parameter {rest!r}"
    if part == "optimizer":
        return f"optimizer entry {rest!r}"
    return f"entry {key!r}"
