"""Llama 3 <-> transformers `LlamaForCausalLM`: key names and config.json."""

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
from kenotron.models.llama3.args import Llama3Args

# Names shared by every Llama-shaped family (Qwen2/3 and Mistral add to these).
LLAMA_TOP_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LLAMA_LAYER_KEYS = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
}


def llama3_args_from_hf_config(config: dict[str, Any]) -> Llama3Args:
    require(config, "hidden_act", "silu", "the MLP is SwiGLU")
    require(config, "attention_bias", False, "Llama 3's projections have no bias")
    require(config, "mlp_bias", False, "Llama 3's projections have no bias")
    require_derived_head_dim(config, "llama3")
    theta, scaling = rope_from_hf_config(config, default_theta=10000.0)
    return Llama3Args(
        **decoder_fields_from_hf_config(config, tie_default=False),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
    )


def hf_config_from_llama3_args(args: Llama3Args) -> dict[str, Any]:
    return {
        **hf_config_decoder_fields(args),
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        **rope_to_hf_config(args.rope_theta, args.rope_scaling),
    }


LLAMA3_HF_ADAPTER = HFAdapter(
    architecture="LlamaForCausalLM",
    model_type="llama",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys=LLAMA_LAYER_KEYS,
    args_from_config=llama3_args_from_hf_config,
    config_from_args=hf_config_from_llama3_args,
)
