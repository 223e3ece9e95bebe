"""Qwen3-MoE <-> transformers `Qwen3MoeForCausalLM`: key names and config.json.

Every block here is an MoE block: checkpoints with dense layers in between (decoder_sparse_step
> 1 or mlp_only_layers) are refused. Experts are stored per expert on the hub
(`mlp.experts.E.gate_proj.weight`) and stacked here (models/hf_experts.py).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from kenotron.models.common.moe import MoEArgs
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
from kenotron.models.qwen3.hf import QK_NORM_KEYS
from kenotron.models.qwen3_moe.model import Qwen3MoEArgs

ATTENTION_KEYS = {k: v for k, v in LLAMA_LAYER_KEYS.items() if not k.startswith("feed_forward.")}
ROUTER_BIAS = ("feed_forward.router.expert_bias",)
SWIGLU_EXPERT_KEYS = {
    "feed_forward.experts.w13": ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
    "feed_forward.experts.w2": ("mlp.experts.{e}.down_proj.weight",),
}


def require_every_layer_moe(config: dict[str, Any]) -> None:
    """kenotron's MoE families put experts in every block."""
    require(config, "decoder_sparse_step", 1, "every block of kenotron's MoE families is an MoE block")
    if config.get("mlp_only_layers"):
        require(config, "mlp_only_layers", [], "every block of kenotron's MoE families is an MoE block")


def expert_count(config: dict[str, Any]) -> int:
    """Routed experts: `num_experts` in published Qwen configs, `num_local_experts` as transformers 5 writes them."""
    return int(config.get("num_experts") or config["num_local_experts"])


def moe_decoder_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The shared decoder fields without the dense MLP width (no block here has a dense MLP)."""
    fields = decoder_fields_from_hf_config(config, tie_default=False)
    del fields["ffn_dim"]
    return fields


def qwen3_moe_args_from_hf_config(config: dict[str, Any]) -> Qwen3MoEArgs:
    require(config, "hidden_act", "silu", "the experts are SwiGLU")
    require(config, "attention_bias", False, "Qwen3's projections have no bias")
    require(config, "use_sliding_window", False, "Qwen3's optional sliding window is not implemented")
    require_every_layer_moe(config)
    theta, scaling = rope_from_hf_config(config, default_theta=1_000_000.0)
    if scaling is not None:
        require(config, "rope_scaling", None, "Qwen3-MoE uses plain RoPE")
    return Qwen3MoEArgs(
        **moe_decoder_fields(config),
        head_dim=head_dim_from_hf_config(config),
        moe=MoEArgs(
            n_experts=expert_count(config), top_k=config["num_experts_per_tok"],
            ffn_dim=config["moe_intermediate_size"], norm_topk=bool(config.get("norm_topk_prob", False)),
        ),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
    )


def moe_hf_config_fields(args: Any) -> dict[str, Any]:
    """Decoder fields of an MoE family's config.json. intermediate_size sizes dense MLPs, which
    no block has: the expert width stands in."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    view = SimpleNamespace(**{**fields, "head_dim": args.head_dim, "ffn_dim": args.moe.ffn_dim})
    return {**hf_config_decoder_fields(view), "decoder_sparse_step": 1, "mlp_only_layers": []}


def hf_config_from_qwen3_moe_args(args: Qwen3MoEArgs) -> dict[str, Any]:
    return {
        **moe_hf_config_fields(args),
        "moe_intermediate_size": args.moe.ffn_dim,
        "num_experts": args.moe.n_experts,
        "num_experts_per_tok": args.moe.top_k,
        "norm_topk_prob": args.moe.norm_topk,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        **rope_to_hf_config(args.rope_theta, None),
    }


QWEN3_MOE_HF_ADAPTER = HFAdapter(
    architecture="Qwen3MoeForCausalLM",
    model_type="qwen3_moe",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**ATTENTION_KEYS, **QK_NORM_KEYS, "feed_forward.router.gate.weight": "mlp.gate.weight"},
    args_from_config=qwen3_moe_args_from_hf_config,
    config_from_args=hf_config_from_qwen3_moe_args,
    expert_keys=SWIGLU_EXPERT_KEYS,
    zero_keys=ROUTER_BIAS,
)
