"""Qwen3-MoE <-> transformers `Qwen3MoeForCausalLM`: key names and config.json.

Every block here is an MoE block: checkpoints with dense layers in between (decoder_sparse_step
> 1 or mlp_only_layers) are refused. Experts are stored per expert on the hub
(`mlp.experts.E.gate_proj.weight`) and stacked here (models/hf_experts.py). The rest of
config.json is Qwen3's, translated by its adapter (`with_experts`, `dense_twin`: Mixtral and
Qwen2-MoE do the same with Mistral's and Qwen2's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.hf_adapter import HFAdapter, require
from kenotron.models.llama3.hf import LLAMA_LAYER_KEYS, LLAMA_TOP_KEYS
from kenotron.models.qwen3.args import Qwen3Args
from kenotron.models.qwen3.hf import QK_NORM_KEYS, hf_config_from_qwen3_args, qwen3_args_from_hf_config
from kenotron.models.qwen3_moe.args import Qwen3MoEArgs

T = TypeVar("T")

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


def with_experts(dense: Any, moe_cls: type[T], moe: MoEArgs) -> T:
    """An MoE family's args from its dense twin's (read from config.json by the dense adapter):
    the same fields but the dense MLP width, which no block here has, and the experts' `moe`."""
    fields = {f.name: getattr(dense, f.name) for f in dataclasses.fields(dense) if f.name != "ffn_dim"}
    return moe_cls(**fields, moe=moe)


def dense_twin(args: Any, dense_cls: type[T]) -> T:
    """The reverse of `with_experts`, for the dense adapter to write config.json from: the expert
    width stands in as ffn_dim (config.json's intermediate_size, which sizes dense MLPs)."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name != "moe"}
    return dense_cls(**fields, ffn_dim=args.moe.ffn_dim)


EVERY_LAYER_MOE = {"decoder_sparse_step": 1, "mlp_only_layers": []}
"""What a Qwen-MoE config.json says when every block is an MoE block."""


def qwen_moe_args_from_hf_config(config: dict[str, Any], **shared: Any) -> MoEArgs:
    """The MoE layer of a Qwen-MoE config.json (`shared`: the shared expert's fields, Qwen2-MoE's)."""
    return MoEArgs(n_experts=expert_count(config), top_k=config["num_experts_per_tok"],
                   ffn_dim=config["moe_intermediate_size"], norm_topk=bool(config.get("norm_topk_prob", False)),
                   **shared)


def qwen_moe_hf_config_fields(moe: MoEArgs) -> dict[str, Any]:
    """The reverse of `qwen_moe_args_from_hf_config` (the routed experts; every block an MoE block)."""
    return {**EVERY_LAYER_MOE, "moe_intermediate_size": moe.ffn_dim, "num_experts": moe.n_experts,
            "num_experts_per_tok": moe.top_k, "norm_topk_prob": moe.norm_topk}


def qwen3_moe_args_from_hf_config(config: dict[str, Any]) -> Qwen3MoEArgs:
    require_every_layer_moe(config)
    return with_experts(qwen3_args_from_hf_config(config), Qwen3MoEArgs, qwen_moe_args_from_hf_config(config))


def hf_config_from_qwen3_moe_args(args: Qwen3MoEArgs) -> dict[str, Any]:
    return {**hf_config_from_qwen3_args(dense_twin(args, Qwen3Args)), **qwen_moe_hf_config_fields(args.moe)}


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
