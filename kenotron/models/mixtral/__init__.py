"""Mixtral family: model, flavors, HF adapter and spec."""

from kenotron.models.common import param_count
from kenotron.models.mixtral.flavors import MIXTRAL_FLAVORS
from kenotron.models.mixtral.hf import MIXTRAL_HF_ADAPTER
from kenotron.models.mixtral.model import Mixtral, MixtralArgs
from kenotron.models.qwen3_moe.parallel_hints import EXPERTS, MOE_MODULES, MOE_TP_STYLES
from kenotron.models.spec import ModelSpec

MIXTRAL_SPEC = ModelSpec(
    name="mixtral",
    model_cls=Mixtral,
    flavors=MIXTRAL_FLAVORS,
    hf_adapter=MIXTRAL_HF_ADAPTER,
    tp_styles=dict(MOE_TP_STYLES),
    moe_modules=MOE_MODULES,
    experts=EXPERTS,
    parameter_count=param_count.mixtral,
)

__all__ = ["MIXTRAL_FLAVORS", "MIXTRAL_HF_ADAPTER", "MIXTRAL_SPEC", "Mixtral", "MixtralArgs"]
