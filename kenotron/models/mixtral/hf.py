"""Mixtral <-> transformers `MixtralForCausalLM`: key names and config.json.

The hub stores the MoE under `block_sparse_moe` with one w1 (gate), w3 (up), w2 (down) per
expert; kenotron stacks them (models/hf_experts.py).
"""

from __future__ import annotations

from typing import Any

from kenotron.models.common.moe import MoEArgs
from kenotron.models.hf_adapter import (
    HFAdapter,
    require,
    require_derived_head_dim,
    rope_from_hf_config,
    rope_to_hf_config,
)
from kenotron.models.llama3.hf import LLAMA_TOP_KEYS
from kenotron.models.mixtral.model import MixtralArgs
from kenotron.models.qwen3_moe.hf import ATTENTION_KEYS, ROUTER_BIAS, moe_decoder_fields, moe_hf_config_fields


def mixtral_args_from_hf_config(config: dict[str, Any]) -> MixtralArgs:
    require(config, "hidden_act", "silu", "the experts are SwiGLU")
    require_derived_head_dim(config, "mixtral")
    theta, scaling = rope_from_hf_config(config, default_theta=1_000_000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Mixtral uses plain RoPE")
    return MixtralArgs(
        **moe_decoder_fields(config),
        moe=MoEArgs(n_experts=config["num_local_experts"], top_k=config["num_experts_per_tok"],
                    ffn_dim=config["intermediate_size"]),
        norm_eps=config.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        sliding_window=config.get("sliding_window") or None,
    )


def hf_config_from_mixtral_args(args: MixtralArgs) -> dict[str, Any]:
    fields = moe_hf_config_fields(args)
    for key in ("decoder_sparse_step", "mlp_only_layers"):  # Qwen-MoE's; Mixtral has experts in every block
        del fields[key]
    return {
        **fields,
        "num_local_experts": args.moe.n_experts,
        "num_experts_per_tok": args.moe.top_k,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "sliding_window": args.sliding_window,
        **rope_to_hf_config(args.rope_theta, None),
    }


MIXTRAL_HF_ADAPTER = HFAdapter(
    architecture="MixtralForCausalLM",
    model_type="mixtral",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**ATTENTION_KEYS, "feed_forward.router.gate.weight": "block_sparse_moe.gate.weight"},
    args_from_config=mixtral_args_from_hf_config,
    config_from_args=hf_config_from_mixtral_args,
    expert_keys={
        "feed_forward.experts.w13": ("block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight"),
        "feed_forward.experts.w2": ("block_sparse_moe.experts.{e}.w2.weight",),
    },
    zero_keys=ROUTER_BIAS,
)
