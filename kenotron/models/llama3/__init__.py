"""Llama 3 family: model, flavors and spec."""

from kenotron.models.common import param_count
from kenotron.models.llama3.flavors import LLAMA3_FLAVORS
from kenotron.models.llama3.hf import LLAMA3_HF_ADAPTER
from kenotron.models.llama3.model import Llama3, Llama3Args, TransformerBlock
from kenotron.models.llama3.parallel_hints import LLAMA3_BLOCKS, LLAMA3_TP_STYLES
from kenotron.models.spec import ModelSpec

LLAMA3_SPEC = ModelSpec(
    name="llama3",
    model_cls=Llama3,
    flavors=LLAMA3_FLAVORS,
    hf_adapter=LLAMA3_HF_ADAPTER,
    tp_styles=LLAMA3_TP_STYLES,
    blocks=LLAMA3_BLOCKS,
    parameter_count=param_count.llama3,
)

__all__ = ["LLAMA3_FLAVORS", "LLAMA3_HF_ADAPTER", "LLAMA3_SPEC", "Llama3", "Llama3Args", "TransformerBlock"]
