"""Qwen3-MoE family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.qwen3_moe.args import Qwen3MoEArgs
from kenotron.models.qwen3_moe.flavors import QWEN3_MOE_FLAVORS
from kenotron.models.qwen3_moe.parallel_hints import EXPERTS, MOE_MODULES, MOE_TP_STYLES
from kenotron.models.spec import ModelSpec

QWEN3_MOE_SPEC = ModelSpec(
    name="qwen3_moe",
    model_cls_path="kenotron.models.qwen3_moe.model:Qwen3MoE",
    flavors=QWEN3_MOE_FLAVORS,
    hf_adapter_path="kenotron.models.qwen3_moe.hf:QWEN3_MOE_HF_ADAPTER",
    tp_styles={
        **MOE_TP_STYLES,
        "layers.*.attention.q_norm": "head_norm",
        "layers.*.attention.k_norm": "head_norm",
    },
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    parameter_count=param_count.qwen3_moe,
)

__all__ = ["QWEN3_MOE_FLAVORS", "QWEN3_MOE_SPEC", "Qwen3MoEArgs"]
