"""StarCoder2 family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import tp_styles_without
from kenotron.models.spec import ModelSpec
from kenotron.models.starcoder2.args import StarCoder2Args
from kenotron.models.starcoder2.flavors import STARCODER2_FLAVORS

# Same module names as Llama 3, so the same tensor-parallel styles apply (no gate projection).
STARCODER2_SPEC = ModelSpec(
    name="starcoder2",
    model_cls_path="kenotron.models.starcoder2.model:StarCoder2",
    flavors=STARCODER2_FLAVORS,
    hf_adapter_path="kenotron.models.starcoder2.hf:STARCODER2_HF_ADAPTER",
    tp_styles=tp_styles_without("layers.*.feed_forward.w3"),
    parameter_count=param_count.starcoder2,
)

__all__ = ["STARCODER2_FLAVORS", "STARCODER2_SPEC", "StarCoder2Args"]
