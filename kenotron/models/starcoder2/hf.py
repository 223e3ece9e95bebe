"""StarCoder2 <-> transformers `Starcoder2ForCausalLM`: key names and config.json."""

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
from kenotron.models.starcoder2.args import StarCoder2Args

STARCODER2_TOP_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "norm.bias": "model.norm.bias",
    "output.weight": "lm_head.weight",
}
STARCODER2_LAYER_KEYS = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention_norm.bias": "input_layernorm.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.bias": "post_attention_layernorm.bias",
    **{
        f"attention.{ours}.{kind}": f"self_attn.{theirs}.{kind}"
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj"))
        for kind in ("weight", "bias")
    },
    **{
        f"feed_forward.{ours}.{kind}": f"mlp.{theirs}.{kind}"
        for ours, theirs in (("w1", "c_fc"), ("w2", "c_proj"))
        for kind in ("weight", "bias")
    },
}


def starcoder2_args_from_hf_config(config: dict[str, Any]) -> StarCoder2Args:
    require(config, "hidden_act", "gelu_pytorch_tanh", "the MLP is GELU with the tanh approximation")
    require_derived_head_dim(config, "starcoder2")
    theta, scaling = rope_from_hf_config(config, default_theta=10000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "StarCoder2 uses plain RoPE")
    return StarCoder2Args(
        **decoder_fields_from_hf_config(config, tie_default=True),
        norm_eps=config.get("norm_epsilon", 1e-5),
        rope_theta=theta,
        sliding_window=config.get("sliding_window") or None,
        bias=bool(config.get("use_bias", True)),
    )


def hf_config_from_starcoder2_args(args: StarCoder2Args) -> dict[str, Any]:
    return {
        **hf_config_decoder_fields(args),
        "norm_epsilon": args.norm_eps,
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": args.sliding_window,
        "use_bias": args.bias,
        **rope_to_hf_config(args.rope_theta, None),
    }


STARCODER2_HF_ADAPTER = HFAdapter(
    architecture="Starcoder2ForCausalLM",
    model_type="starcoder2",
    top_keys=STARCODER2_TOP_KEYS,
    layer_keys=STARCODER2_LAYER_KEYS,
    args_from_config=starcoder2_args_from_hf_config,
    config_from_args=hf_config_from_starcoder2_args,
)
