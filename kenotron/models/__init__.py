"""Model families. `get_model_spec(name)` is the registry the trainer and tools use."""

from __future__ import annotations

from kenotron.models.llama3 import LLAMA3_SPEC
from kenotron.models.mamba2 import MAMBA2_SPEC
from kenotron.models.mistral import MISTRAL_SPEC
from kenotron.models.mixtral import MIXTRAL_SPEC
from kenotron.models.qwen2 import QWEN2_SPEC
from kenotron.models.qwen2_moe import QWEN2_MOE_SPEC
from kenotron.models.qwen3 import QWEN3_SPEC
from kenotron.models.qwen3_moe import QWEN3_MOE_SPEC
from kenotron.models.spec import ModelSpec, UnknownModelError
from kenotron.models.starcoder2 import STARCODER2_SPEC

MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (LLAMA3_SPEC, QWEN2_SPEC, QWEN3_SPEC, MISTRAL_SPEC, STARCODER2_SPEC, QWEN3_MOE_SPEC, MIXTRAL_SPEC,
                 QWEN2_MOE_SPEC, MAMBA2_SPEC)
}


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under `name`, or an error listing the known families."""
    if name not in MODEL_SPECS:
        raise UnknownModelError(f"model.name={name!r} is not a known model; use one of {', '.join(MODEL_SPECS)}")
    return MODEL_SPECS[name]


__all__ = ["MODEL_SPECS", "ModelSpec", "UnknownModelError", "get_model_spec"]
