"""Mistral family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES
from kenotron.models.mistral.args import MistralArgs
from kenotron.models.mistral.flavors import MISTRAL_FLAVORS
from kenotron.models.spec import ModelSpec

# Same module names as Llama 3, so the same tensor-parallel styles apply.
MISTRAL_SPEC = ModelSpec(
    name="mistral",
    model_cls_path="kenotron.models.mistral.model:Mistral",
    flavors=MISTRAL_FLAVORS,
    hf_adapter_path="kenotron.models.mistral.hf:MISTRAL_HF_ADAPTER",
    tp_styles=dict(LLAMA3_TP_STYLES),
    parameter_count=param_count.llama3,
)

__all__ = ["MISTRAL_FLAVORS", "MISTRAL_SPEC", "MistralArgs"]
