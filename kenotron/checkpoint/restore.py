"""Restoring a run's parts from one checkpoint folder (CheckpointManager.load_from): which parts
the folder can give, the checks before anything is read (family, legacy pickles, shapes and
settings), the DCP load into templates of the saved sizes, and the check after (no NaN or Inf).

Every rank calls restore_parts (the load is collective); rank 0 alone verifies the checksums
first (verify_files, run by the manager on rank 0 for all)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kenotron.checkpoint import integrity
from kenotron.checkpoint.checks import (
    check_same_family,
    check_same_settings,
    check_state_fits,
    flatten_state_dict,
    setting_differences,
)
from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.checkpoint.finite import first_nonfinite, nonfinite_load_error
from kenotron.checkpoint.folders import LEGACY_FORMAT_TAGS, check_checkpoint, step_folder_name
from kenotron.checkpoint.state import HasState
from kenotron.checkpoint.trust import load_state

logger = logging.getLogger("kenotron")


def verify_files(path: str) -> None:
    """The folder's files against its marker's checksums (rank 0, once per load)."""
    marker = check_checkpoint(path, verify_checksums=False)[0]
    integrity.verify_checksums(path, marker)


def restore_parts(path: Path, parts: dict[str, HasState], *, exclude: Sequence[str], model_info: dict[str, Any],
                  model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                  masters_follow_model: Sequence[Callable[[], None]], run_folder: Path,
                  process_group: dist.ProcessGroup | None) -> int:
    """Load the `parts` not in `exclude` from the checkpoint folder `path`; returns its step.
    `model_info` is what the checks compare the saved model against; `masters_follow_model`
    copy the loaded weights into optimizers' masters when the optimizer part is not loaded;
    `run_folder` (the run's checkpoint folder) is named in a non-finite load's advice."""
    marker, metadata = check_checkpoint(path, verify_checksums=False)
    saved_parts = set(marker.get("parts", []))
    names = [n for n in parts if n not in set(exclude)]
    if marker.get("model_only"):
        skipped = [n for n in names if n != "model"]
        if skipped:
            logger.info("%s holds model weights only: %s start fresh", path, ", ".join(skipped))
        names = [n for n in names if n == "model"]
    absent = [n for n in names if n not in saved_parts]
    if absent:
        raise CheckpointFormatError(
            f"{path} holds no {absent[0]!r} part (it has {', '.join(sorted(saved_parts))}); add {absent[0]!r} "
            f"to checkpoint.exclude_from_loading to start that part fresh"
        )
    check_same_family(marker.get("model"), model_info, path)
    differences = setting_differences(marker.get("model"), model_info) if "model" in names else []
    legacy = [n for n in names if n in ("lr_scheduler", "dataloader", "train_state")]
    if marker.get("format") in LEGACY_FORMAT_TAGS and legacy:
        raise CheckpointFormatError(
            f"{path} was written by an earlier kenotron (format {marker['format']}), which stored {', '.join(legacy)} "
            f"as Python pickles; unpickling runs whatever code the file holds, so kenotron does not read them. "
            f"Its model and optimizer load safely: add {','.join(legacy)} to checkpoint.exclude_from_loading"
        )
    state = {name: _load_template(name, parts[name], metadata) for name in names}
    check_state_fits(state, metadata, path, _describe_model(marker.get("model")),
                     _whole_model_keys(state, process_group), differences)
    check_same_settings(differences, path)  # what the shapes cannot tell: RoPE, norm eps, window, ...
    load_state(state, path, process_group=process_group)
    for name in names:
        parts[name].load_state_dict(state[name])
    if "model" in names and "optimizer" not in names:
        # The masters must follow the loaded weights. Not when the optimizer part is loaded
        # too: dcp.load wrote its saved masters into the live state tensors, which a copy
        # from the (bf16) parameters would overwrite.
        for masters_from_params in masters_follow_model:
            masters_from_params()
    step = int(marker["step"])
    bad = first_nonfinite(model_parts, optimizers, process_group)
    if bad is not None:  # a bit flipped on disk without checksums: stop here, not at the next save
        raise nonfinite_load_error(path, step, bad, run_folder)
    logger.info("loaded %s (%s) from %s", step_folder_name(step), ", ".join(names), path)
    return step


def _load_template(name: str, part: HasState, metadata: Any) -> Any:
    """What DCP loads part `name` into: its state dict, or for parts whose sizes depend on
    the saved values (JSON), tensors of the saved sizes."""
    if not hasattr(part, "load_template"):
        return part.state_dict()
    prefix = name + "."
    saved = {key[len(prefix):]: getattr(info, "size", None)
             for key, info in metadata.state_dict_metadata.items() if key.startswith(prefix)}
    return part.load_template({k: v for k, v in saved.items() if v is not None})


def _whole_model_keys(state: dict[str, Any], process_group: dist.ProcessGroup | None) -> set[str] | None:
    """The "model." keys held by all ranks together: under pipeline parallel each rank holds
    only its stages' parameters, and the checkpoint has the others' too."""
    if "model" not in state or not (dist.is_available() and dist.is_initialized()):
        return None
    mine = sorted(k for k in flatten_state_dict({"model": state["model"]}) if k.startswith("model."))
    gathered: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(gathered, mine, group=process_group)
    return {k for keys in gathered for k in keys}


def _describe_model(info: Any) -> str:
    """`name=llama3, flavor=debug` from a marker's model info (the dimensions are left out)."""
    if not isinstance(info, dict):
        return str(info or "")
    return ", ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, (dict, list)) and v != "")
