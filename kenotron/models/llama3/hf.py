"""Llama 3 <-> transformers `LlamaForCausalLM`: key names and config.json."""

from __future__ import annotations

from typing import Any

from kenotron.models.hf_adapter import (
    HFAdapter,
    HFConversionError,
    head_dim_from_hf_config,
    require,
    rope_from_hf_config,
    rope_to_hf_config,
)
from kenotron.models.llama3.model import Llama3Args

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
    n_heads = config["num_attention_heads"]
    if head_dim_from_hf_config(config) * n_heads != config["hidden_size"]:
        raise HFConversionError(
            f"config.json has head_dim={config['head_dim']} but Llama3Args derives hidden_size / "
            f"num_attention_heads = {config['hidden_size'] // n_heads}; such a checkpoint is not a Llama 3"
        )
    theta, scaling = rope_from_hf_config(config, default_theta=10000.0)
    return Llama3Args(
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        ffn_dim=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=config.get("tie_word_embeddings", False),
        max_seq_len=config.get("max_position_embeddings", 8192),
    )


def hf_config_from_llama3_args(args: Llama3Args) -> dict[str, Any]:
    return {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.ffn_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": args.tie_embeddings,
        "max_position_embeddings": args.max_seq_len,
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
