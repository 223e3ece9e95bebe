"""Qwen3 family: model, flavors, HF adapter and spec."""

from kenotron.models.qwen3.flavors import QWEN3_FLAVORS
from kenotron.models.qwen3.hf import QWEN3_HF_ADAPTER
from kenotron.models.qwen3.model import Qwen3, Qwen3Args
from kenotron.models.spec import ModelSpec

QWEN3_SPEC = ModelSpec(name="qwen3", model_cls=Qwen3, flavors=QWEN3_FLAVORS, hf_adapter=QWEN3_HF_ADAPTER)

__all__ = ["QWEN3_FLAVORS", "QWEN3_HF_ADAPTER", "QWEN3_SPEC", "Qwen3", "Qwen3Args"]
