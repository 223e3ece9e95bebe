"""Mamba-2 family (and hybrids with attention layers): args, flavors and spec (the model and HF
adapter are imported on first use)."""

from kenotron.models.common import param_count
from kenotron.models.mamba2.args import Mamba2Args, check_mamba2_args
from kenotron.models.mamba2.flavors import MAMBA2_FLAVORS
from kenotron.models.mamba2.parallel_hints import (
    MAMBA2_TP_STYLES,
    NO_CONTEXT_PARALLEL,
    NO_DOCUMENT_MASKING,
    mamba2_mixing_flops,
    mamba2_tp_divisors,
    mamba2_tp_styles,
)
from kenotron.models.spec import ModelSpec

MAMBA2_SPEC = ModelSpec(
    name="mamba2",
    model_cls_path="kenotron.models.mamba2.model:Mamba2",
    flavors=MAMBA2_FLAVORS,
    hf_adapter_path="kenotron.models.mamba2.hf:MAMBA2_HF_ADAPTER",
    tp_styles=MAMBA2_TP_STYLES,
    tp_styles_for=mamba2_tp_styles,
    attention_modules=None,
    tp_divisors=mamba2_tp_divisors,
    mixing_flops=mamba2_mixing_flops,
    no_context_parallel=NO_CONTEXT_PARALLEL,
    no_document_masking=NO_DOCUMENT_MASKING,
    check_args=check_mamba2_args,
    parameter_count=param_count.mamba2,
)

__all__ = ["MAMBA2_FLAVORS", "MAMBA2_SPEC", "Mamba2Args"]
