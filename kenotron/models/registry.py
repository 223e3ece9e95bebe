"""The model registry: family name -> ModelSpec, each family's package imported on first use.

A run asks for one family; importing all nine (and through the hybrid one the Mamba-2 layers)
for every run would cost start-up time for nothing, so a family is imported only when its spec
is read. Iterating the registry (`--list-models`, the HF import's lookup by model type) reads,
and so imports, every family.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from kenotron.models.spec import ModelSpec

FAMILIES: dict[str, tuple[str, str]] = {
    "llama3": ("kenotron.models.llama3", "LLAMA3_SPEC"),
    "qwen2": ("kenotron.models.qwen2", "QWEN2_SPEC"),
    "qwen3": ("kenotron.models.qwen3", "QWEN3_SPEC"),
    "mistral": ("kenotron.models.mistral", "MISTRAL_SPEC"),
    "starcoder2": ("kenotron.models.starcoder2", "STARCODER2_SPEC"),
    "qwen3_moe": ("kenotron.models.qwen3_moe", "QWEN3_MOE_SPEC"),
    "mixtral": ("kenotron.models.mixtral", "MIXTRAL_SPEC"),
    "qwen2_moe": ("kenotron.models.qwen2_moe", "QWEN2_MOE_SPEC"),
    "mamba2": ("kenotron.models.mamba2", "MAMBA2_SPEC"),
    "deepseek_v3": ("kenotron.models.deepseek_v3", "DEEPSEEK_V3_SPEC"),
}
"""{family name: (its package, the name of its ModelSpec there)}; a new family adds one line."""


class ModelRegistry(Mapping[str, ModelSpec]):
    """{family name: ModelSpec} over `families`; reading a spec imports its family's package
    (Python's module cache keeps it), listing the names imports nothing."""

    def __init__(self, families: Mapping[str, tuple[str, str]]) -> None:
        self._families = dict(families)

    def __getitem__(self, name: str) -> ModelSpec:
        module, attribute = self._families[name]
        spec = getattr(importlib.import_module(module), attribute)
        if spec.name != name:
            raise AssertionError(f"{module}.{attribute} is named {spec.name!r}, registered as {name!r}")
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def __iter__(self) -> Iterator[str]:
        return iter(self._families)

    def __len__(self) -> int:
        return len(self._families)
