"""Mistral family: model, flavors, HF adapter and spec."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES
from kenotron.models.mistral.flavors import MISTRAL_FLAVORS
from kenotron.models.mistral.hf import MISTRAL_HF_ADAPTER
from kenotron.models.mistral.model import Mistral, MistralArgs
from kenotron.models.spec import ModelSpec

# Same module names as Llama 3, so the same tensor-parallel styles apply.
MISTRAL_SPEC = ModelSpec(
    name="mistral",
    model_cls=Mistral,
    flavors=MISTRAL_FLAVORS,
    hf_adapter=MISTRAL_HF_ADAPTER,
    tp_styles=dict(LLAMA3_TP_STYLES),
    parameter_count=param_count.llama3,
)

__all__ = ["MISTRAL_FLAVORS", "MISTRAL_HF_ADAPTER", "MISTRAL_SPEC", "Mistral", "MistralArgs"]
