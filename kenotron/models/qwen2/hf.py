"""Qwen2 / Qwen2.5 <-> transformers `Qwen2ForCausalLM`: key names and config.json."""

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
from kenotron.models.qwen2.args import Qwen2Args

QKV_BIAS_KEYS = {
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
}


def qwen2_args_from_hf_config(config: dict[str, Any], family: str = "qwen2") -> Qwen2Args:
    """`family`: the name errors give (Qwen2-MoE's adapter reads its decoder fields through this one)."""
    require(config, "hidden_act", "silu", "the MLP is SwiGLU")
    require(config, "use_sliding_window", False, "Qwen2's optional sliding window is not implemented")
    require_derived_head_dim(config, family)
    theta, scaling = rope_from_hf_config(config, default_theta=1_000_000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Qwen2 uses plain RoPE")
    return Qwen2Args(
        **decoder_fields_from_hf_config(config, tie_default=False),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
    )


def hf_config_from_qwen2_args(args: Qwen2Args) -> dict[str, Any]:
    return {
        **hf_config_decoder_fields(args),
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "use_sliding_window": False,
        **rope_to_hf_config(args.rope_theta, None),
    }


QWEN2_HF_ADAPTER = HFAdapter(
    architecture="Qwen2ForCausalLM",
    model_type="qwen2",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**LLAMA_LAYER_KEYS, **QKV_BIAS_KEYS},
    args_from_config=qwen2_args_from_hf_config,
    config_from_args=hf_config_from_qwen2_args,
)
