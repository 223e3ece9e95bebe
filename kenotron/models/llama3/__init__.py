"""Llama 3 family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.llama3.args import Llama3Args
from kenotron.models.llama3.flavors import LLAMA3_FLAVORS
from kenotron.models.llama3.parallel_hints import LLAMA3_BLOCKS, LLAMA3_TP_STYLES
from kenotron.models.spec import ModelSpec

LLAMA3_SPEC = ModelSpec(
    name="llama3",
    model_cls_path="kenotron.models.llama3.model:Llama3",
    flavors=LLAMA3_FLAVORS,
    hf_adapter_path="kenotron.models.llama3.hf:LLAMA3_HF_ADAPTER",
    tp_styles=LLAMA3_TP_STYLES,
    blocks=LLAMA3_BLOCKS,
    parameter_count=param_count.llama3,
)

__all__ = ["LLAMA3_FLAVORS", "LLAMA3_SPEC", "Llama3Args"]
