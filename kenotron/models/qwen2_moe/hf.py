"""Qwen2-MoE <-> transformers `Qwen2MoeForCausalLM`: key names and config.json.

Every block here is an MoE block with the gated shared expert (its HF `shared_expert` and
`shared_expert_gate`); experts are stored per expert on the hub and stacked here.
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
from kenotron.models.qwen2.hf import QKV_BIAS_KEYS
from kenotron.models.qwen2_moe.model import Qwen2MoEArgs
from kenotron.models.qwen3_moe.hf import (
    ATTENTION_KEYS,
    ROUTER_BIAS,
    SWIGLU_EXPERT_KEYS,
    expert_count,
    moe_decoder_fields,
    moe_hf_config_fields,
    require_every_layer_moe,
)

SHARED_KEYS = {
    "feed_forward.router.gate.weight": "mlp.gate.weight",
    "feed_forward.shared_experts.w1.weight": "mlp.shared_expert.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_expert.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_expert.down_proj.weight",
    "feed_forward.shared_gate.weight": "mlp.shared_expert_gate.weight",
}


def qwen2_moe_args_from_hf_config(config: dict[str, Any]) -> Qwen2MoEArgs:
    require(config, "hidden_act", "silu", "the experts are SwiGLU")
    require(config, "use_sliding_window", False, "Qwen2's optional sliding window is not implemented")
    require_every_layer_moe(config)
    require_derived_head_dim(config, "qwen2_moe")
    if not config.get("shared_expert_intermediate_size"):
        require(config, "shared_expert_intermediate_size", 1, "Qwen2-MoE has a shared expert")
    theta, scaling = rope_from_hf_config(config, default_theta=1_000_000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Qwen2-MoE uses plain RoPE")
    return Qwen2MoEArgs(
        **moe_decoder_fields(config),
        moe=MoEArgs(
            n_experts=expert_count(config), top_k=config["num_experts_per_tok"],
            ffn_dim=config["moe_intermediate_size"], norm_topk=bool(config.get("norm_topk_prob", False)),
            shared_ffn_dim=config["shared_expert_intermediate_size"], shared_gate=True,
        ),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
    )


def hf_config_from_qwen2_moe_args(args: Qwen2MoEArgs) -> dict[str, Any]:
    return {
        **moe_hf_config_fields(args),
        "moe_intermediate_size": args.moe.ffn_dim,
        "shared_expert_intermediate_size": args.moe.shared_ffn_dim,
        "num_experts": args.moe.n_experts,
        "num_experts_per_tok": args.moe.top_k,
        "norm_topk_prob": args.moe.norm_topk,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "use_sliding_window": False,
        **rope_to_hf_config(args.rope_theta, None),
    }


QWEN2_MOE_HF_ADAPTER = HFAdapter(
    architecture="Qwen2MoeForCausalLM",
    model_type="qwen2_moe",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**ATTENTION_KEYS, **QKV_BIAS_KEYS, **SHARED_KEYS},
    args_from_config=qwen2_moe_args_from_hf_config,
    config_from_args=hf_config_from_qwen2_moe_args,
    expert_keys=SWIGLU_EXPERT_KEYS,
    zero_keys=ROUTER_BIAS,
)
