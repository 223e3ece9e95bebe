"""Mistral family: model, flavors, HF adapter and spec."""

from kenotron.models.mistral.flavors import MISTRAL_FLAVORS
from kenotron.models.mistral.hf import MISTRAL_HF_ADAPTER
from kenotron.models.mistral.model import Mistral, MistralArgs
from kenotron.models.spec import ModelSpec

MISTRAL_SPEC = ModelSpec(name="mistral", model_cls=Mistral, flavors=MISTRAL_FLAVORS, hf_adapter=MISTRAL_HF_ADAPTER)

__all__ = ["MISTRAL_FLAVORS", "MISTRAL_HF_ADAPTER", "MISTRAL_SPEC", "Mistral", "MistralArgs"]
