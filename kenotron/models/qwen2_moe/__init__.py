"""Qwen2-MoE family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.qwen2_moe.args import Qwen2MoEArgs
from kenotron.models.qwen2_moe.flavors import QWEN2_MOE_FLAVORS
from kenotron.models.qwen3_moe.parallel_hints import EXPERTS, MOE_MODULES, MOE_TP_STYLES
from kenotron.models.spec import ModelSpec

QWEN2_MOE_SPEC = ModelSpec(
    name="qwen2_moe",
    model_cls_path="kenotron.models.qwen2_moe.model:Qwen2MoE",
    flavors=QWEN2_MOE_FLAVORS,
    hf_adapter_path="kenotron.models.qwen2_moe.hf:QWEN2_MOE_HF_ADAPTER",
    tp_styles=dict(MOE_TP_STYLES),
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    parameter_count=param_count.qwen2_moe,
)

__all__ = ["QWEN2_MOE_FLAVORS", "QWEN2_MOE_SPEC", "Qwen2MoEArgs"]
