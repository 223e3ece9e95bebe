"""Mixtral family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.mixtral.args import MixtralArgs
from kenotron.models.mixtral.flavors import MIXTRAL_FLAVORS
from kenotron.models.qwen3_moe.parallel_hints import EXPERTS, MOE_MODULES, MOE_TP_STYLES
from kenotron.models.spec import ModelSpec

MIXTRAL_SPEC = ModelSpec(
    name="mixtral",
    model_cls_path="kenotron.models.mixtral.model:Mixtral",
    flavors=MIXTRAL_FLAVORS,
    hf_adapter_path="kenotron.models.mixtral.hf:MIXTRAL_HF_ADAPTER",
    tp_styles=dict(MOE_TP_STYLES),
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    parameter_count=param_count.mixtral,
)

__all__ = ["MIXTRAL_FLAVORS", "MIXTRAL_SPEC", "MixtralArgs"]
