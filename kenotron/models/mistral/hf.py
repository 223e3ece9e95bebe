"""Mistral <-> transformers `MistralForCausalLM`: key names (Llama's) and config.json."""

from __future__ import annotations

from typing import Any

from kenotron.models.hf_adapter import (
    HFAdapter,
    decoder_fields_from_hf_config,
    hf_config_decoder_fields,
    require,
    require_derived_head_dim,
    rope_from_hf_config,
    rope_to_hf_config,
)
from kenotron.models.llama3.hf import LLAMA_LAYER_KEYS, LLAMA_TOP_KEYS
from kenotron.models.mistral.args import MistralArgs


def mistral_args_from_hf_config(config: dict[str, Any], family: str = "mistral") -> MistralArgs:
    """`family`: the name errors give (Mixtral's adapter reads its decoder fields through this one)."""
    require(config, "hidden_act", "silu", "the MLP is SwiGLU")
    require_derived_head_dim(config, family)
    theta, scaling = rope_from_hf_config(config, default_theta=10000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Mistral uses plain RoPE")
    return MistralArgs(
        **decoder_fields_from_hf_config(config, tie_default=False),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        sliding_window=config.get("sliding_window") or None,
    )


def hf_config_from_mistral_args(args: MistralArgs) -> dict[str, Any]:
    return {
        **hf_config_decoder_fields(args),
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "sliding_window": args.sliding_window,
        **rope_to_hf_config(args.rope_theta, None),
    }


MISTRAL_HF_ADAPTER = HFAdapter(
    architecture="MistralForCausalLM",
    model_type="mistral",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys=LLAMA_LAYER_KEYS,
    args_from_config=mistral_args_from_hf_config,
    config_from_args=hf_config_from_mistral_args,
)
