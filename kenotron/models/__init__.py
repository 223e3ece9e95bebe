"""Model families. `get_model_spec(name)` is the registry the trainer and tools use; a family's
package is imported when its spec is first asked for (registry.py)."""

from __future__ import annotations

from collections.abc import Mapping

from kenotron.models.registry import FAMILIES, ModelRegistry
from kenotron.models.spec import ModelSpec, UnknownModelError

MODEL_SPECS: Mapping[str, ModelSpec] = ModelRegistry(FAMILIES)
"""Every family by name, in the order `--list-models` prints them."""


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under `name`, or an error listing the known families."""
    if name not in MODEL_SPECS:
        raise UnknownModelError(f"model.name={name!r} is not a known model; use one of {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


__all__ = ["MODEL_SPECS", "ModelSpec", "UnknownModelError", "get_model_spec"]
