"""Qwen2-MoE <-> transformers `Qwen2MoeForCausalLM`: key names and config.json.

Every block here is an MoE block with the gated shared expert (its HF `shared_expert` and
`shared_expert_gate`); experts are stored per expert on the hub and stacked here.
"""

from __future__ import annotations

from typing import Any

from kenotron.models.hf_adapter import HFAdapter, require
from kenotron.models.llama3.hf import LLAMA_TOP_KEYS
from kenotron.models.qwen2.args import Qwen2Args
from kenotron.models.qwen2.hf import QKV_BIAS_KEYS, hf_config_from_qwen2_args, qwen2_args_from_hf_config
from kenotron.models.qwen2_moe.args import Qwen2MoEArgs
from kenotron.models.qwen3_moe.hf import (
    ATTENTION_KEYS,
    ROUTER_BIAS,
    SWIGLU_EXPERT_KEYS,
    dense_twin,
    qwen_moe_args_from_hf_config,
    qwen_moe_hf_config_fields,
    require_every_layer_moe,
    with_experts,
)

SHARED_KEYS = {
    "feed_forward.router.gate.weight": "mlp.gate.weight",
    "feed_forward.shared_experts.w1.weight": "mlp.shared_expert.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_expert.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_expert.down_proj.weight",
    "feed_forward.shared_gate.weight": "mlp.shared_expert_gate.weight",
}


def qwen2_moe_args_from_hf_config(config: dict[str, Any]) -> Qwen2MoEArgs:
    require_every_layer_moe(config)
    if not config.get("shared_expert_intermediate_size"):
        require(config, "shared_expert_intermediate_size", 1, "Qwen2-MoE has a shared expert")
    moe = qwen_moe_args_from_hf_config(config, shared_ffn_dim=config["shared_expert_intermediate_size"],
                                       shared_gate=True)
    return with_experts(qwen2_args_from_hf_config(config, family="qwen2_moe"), Qwen2MoEArgs, moe)


def hf_config_from_qwen2_moe_args(args: Qwen2MoEArgs) -> dict[str, Any]:
    return {**hf_config_from_qwen2_args(dense_twin(args, Qwen2Args)), **qwen_moe_hf_config_fields(args.moe),
            "shared_expert_intermediate_size": args.moe.shared_ffn_dim}


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
