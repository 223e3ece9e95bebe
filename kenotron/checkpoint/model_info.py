"""What a checkpoint records about its model, so tools can rebuild it without the run's config.

The completion marker of every checkpoint the trainer writes holds `describe_model(...)`:
the family name, the flavor, and, for families with a Hugging Face adapter, the model's
dimensions as a transformers config.json dict (one format that already round-trips through
the adapter). `model_from_info` turns that back into (spec, args).
"""

from __future__ import annotations

from typing import Any

from kenotron.checkpoint.errors import CheckpointFormatError
from kenotron.models import ModelSpec, get_model_spec


def describe_model(spec: ModelSpec, args: Any, flavor: str = "") -> dict[str, Any]:
    """{"name", "flavor", "hf_config"} for a completion marker (hf_config only with an adapter)."""
    info: dict[str, Any] = {"name": spec.name, "flavor": flavor}
    if spec.hf_adapter is not None:
        info["hf_config"] = spec.hf_adapter.hf_config_from_args(args)
    return info


def model_from_info(info: dict[str, Any] | None, where: str) -> tuple[ModelSpec, Any]:
    """(spec, args) of the model a checkpoint was saved from; `where` names it in errors."""
    if not info or "name" not in info:
        raise CheckpointFormatError(
            f"{where} does not record which model it holds (it was not written by kenotron's trainer); "
            f"pass the model family and its config explicitly"
        )
    spec = get_model_spec(info["name"])
    if spec.hf_adapter is None or "hf_config" not in info:
        raise CheckpointFormatError(
            f"{where} holds a {info['name']} model whose dimensions are not recorded (the family has no "
            f"Hugging Face adapter); build the model yourself and use CheckpointManager.load_from"
        )
    return spec, spec.hf_adapter.args_from_hf_config(info["hf_config"])
