"""Qwen3 <-> transformers `Qwen3ForCausalLM`: key names and config.json."""

from __future__ import annotations

from typing import Any

from kenotron.models.hf_adapter import (
    HFAdapter,
    decoder_fields_from_hf_config,
    head_dim_from_hf_config,
    hf_config_decoder_fields,
    require,
    rope_from_hf_config,
    rope_to_hf_config,
)
from kenotron.models.llama3.hf import LLAMA_LAYER_KEYS, LLAMA_TOP_KEYS
from kenotron.models.qwen3.args import Qwen3Args

QK_NORM_KEYS = {
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}


def qwen3_args_from_hf_config(config: dict[str, Any]) -> Qwen3Args:
    require(config, "hidden_act", "silu", "the MLP is SwiGLU")
    require(config, "attention_bias", False, "Qwen3's projections have no bias")
    require(config, "use_sliding_window", False, "Qwen3's optional sliding window is not implemented")
    theta, scaling = rope_from_hf_config(config, default_theta=1_000_000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Qwen3 uses plain RoPE")
    return Qwen3Args(
        **decoder_fields_from_hf_config(config, tie_default=False),
        head_dim=head_dim_from_hf_config(config),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
    )


def hf_config_from_qwen3_args(args: Qwen3Args) -> dict[str, Any]:
    return {
        **hf_config_decoder_fields(args),
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        **rope_to_hf_config(args.rope_theta, None),
    }


QWEN3_HF_ADAPTER = HFAdapter(
    architecture="Qwen3ForCausalLM",
    model_type="qwen3",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**LLAMA_LAYER_KEYS, **QK_NORM_KEYS},
    args_from_config=qwen3_args_from_hf_config,
    config_from_args=hf_config_from_qwen3_args,
)
