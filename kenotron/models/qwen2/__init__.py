"""Qwen2 family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES
from kenotron.models.qwen2.args import Qwen2Args
from kenotron.models.qwen2.flavors import QWEN2_FLAVORS
from kenotron.models.spec import ModelSpec

# Same module names as Llama 3, so the same tensor-parallel styles apply.
QWEN2_SPEC = ModelSpec(
    name="qwen2",
    model_cls_path="kenotron.models.qwen2.model:Qwen2",
    flavors=QWEN2_FLAVORS,
    hf_adapter_path="kenotron.models.qwen2.hf:QWEN2_HF_ADAPTER",
    tp_styles=dict(LLAMA3_TP_STYLES),
    parameter_count=param_count.qwen2,
)

__all__ = ["QWEN2_FLAVORS", "QWEN2_SPEC", "Qwen2Args"]
