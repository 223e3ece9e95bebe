"""Qwen2 family: model, flavors, HF adapter and spec."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES
from kenotron.models.qwen2.flavors import QWEN2_FLAVORS
from kenotron.models.qwen2.hf import QWEN2_HF_ADAPTER
from kenotron.models.qwen2.model import Qwen2, Qwen2Args
from kenotron.models.spec import ModelSpec

# Same module names as Llama 3, so the same tensor-parallel styles apply.
QWEN2_SPEC = ModelSpec(
    name="qwen2",
    model_cls=Qwen2,
    flavors=QWEN2_FLAVORS,
    hf_adapter=QWEN2_HF_ADAPTER,
    tp_styles=dict(LLAMA3_TP_STYLES),
    parameter_count=param_count.qwen2,
)

__all__ = ["QWEN2_FLAVORS", "QWEN2_HF_ADAPTER", "QWEN2_SPEC", "Qwen2", "Qwen2Args"]
