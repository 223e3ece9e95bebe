"""StarCoder2 family: model, flavors, HF adapter and spec."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import tp_styles_without
from kenotron.models.spec import ModelSpec
from kenotron.models.starcoder2.flavors import STARCODER2_FLAVORS
from kenotron.models.starcoder2.hf import STARCODER2_HF_ADAPTER
from kenotron.models.starcoder2.model import StarCoder2, StarCoder2Args

# Same module names as Llama 3, so the same tensor-parallel styles apply (no gate projection).
STARCODER2_SPEC = ModelSpec(
    name="starcoder2",
    model_cls=StarCoder2,
    flavors=STARCODER2_FLAVORS,
    hf_adapter=STARCODER2_HF_ADAPTER,
    tp_styles=tp_styles_without("layers.*.feed_forward.w3"),
    parameter_count=param_count.starcoder2,
)

__all__ = ["STARCODER2_FLAVORS", "STARCODER2_HF_ADAPTER", "STARCODER2_SPEC", "StarCoder2", "StarCoder2Args"]
