"""Qwen3 family: args, flavors and spec (the model and HF adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES
from kenotron.models.qwen3.args import Qwen3Args
from kenotron.models.qwen3.flavors import QWEN3_FLAVORS
from kenotron.models.spec import ModelSpec

# Llama 3's module names and styles, plus the per-head q/k norms over the tp-sharded heads.
QWEN3_SPEC = ModelSpec(
    name="qwen3",
    model_cls_path="kenotron.models.qwen3.model:Qwen3",
    flavors=QWEN3_FLAVORS,
    hf_adapter_path="kenotron.models.qwen3.hf:QWEN3_HF_ADAPTER",
    tp_styles={
        **LLAMA3_TP_STYLES,
        "layers.*.attention.q_norm": "head_norm",
        "layers.*.attention.k_norm": "head_norm",
    },
    parameter_count=param_count.qwen3,
)

__all__ = ["QWEN3_FLAVORS", "QWEN3_SPEC", "Qwen3Args"]
