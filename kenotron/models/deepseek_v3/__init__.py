"""DeepSeek-V3 family (also Moonlight and Kimi K2): args, flavors and spec (the model and HF
adapter are imported on first use)."""

from __future__ import annotations

from kenotron.models.common import param_count
from kenotron.models.deepseek_v3.args import (
    DeepSeekV3Args,
    check_deepseek_v3_args,
    deepseek_v3_tp_divisors,
    latent_mixing_flops,
)
from kenotron.models.deepseek_v3.flavors import DEEPSEEK_V3_FLAVORS
from kenotron.models.deepseek_v3.parallel_hints import (
    DEEPSEEK_V3_TP_STYLES,
    EXPERTS,
    MOE_MODULES,
    deepseek_v3_tp_styles,
)
from kenotron.models.spec import ModelSpec

DEEPSEEK_V3_SPEC = ModelSpec(
    name="deepseek_v3",
    model_cls_path="kenotron.models.deepseek_v3.model:DeepSeekV3",
    flavors=DEEPSEEK_V3_FLAVORS,
    hf_adapter_path="kenotron.models.deepseek_v3.hf:DEEPSEEK_V3_HF_ADAPTER",
    tp_styles=DEEPSEEK_V3_TP_STYLES,
    tp_styles_for=deepseek_v3_tp_styles,
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    tp_divisors=deepseek_v3_tp_divisors,
    mixing_flops=latent_mixing_flops,
    check_args=check_deepseek_v3_args,
    parameter_count=param_count.deepseek_v3,
)

__all__ = ["DEEPSEEK_V3_FLAVORS", "DEEPSEEK_V3_SPEC", "DeepSeekV3Args"]
