"""DeepSeek-V3 <-> transformers `DeepseekV3ForCausalLM`: key names and config.json.

Published checkpoints (DeepSeek-V3, Moonlight, Kimi K2) rotate interleaved RoPE pairs
(`rope_interleave`); kenotron rotates halves, so the RoPE rows of the query projection (per
head) and of wkv_a (the shared key) are reordered on conversion (models/common/latent_attention.py's
`deinterleave_rows`). The router's bias is HF's `e_score_correction_bias` and converts both
ways. Experts are stored per expert on the hub and stacked here, as in the other MoE families.
transformers' class always routes by sigmoid scores: a softmax-routed flavor (`16B`) has no HF form.
The multi-token-prediction modules are blocks n_layers.. on both sides (HF's checkpoints also
hold a copy of the embedding and the output head in each: skipped on import, not written).
"""

from __future__ import annotations

from typing import Any

import torch

from kenotron.models.common.latent_attention import deinterleave_rows
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.rope_scaling import YarnScaling
from kenotron.models.deepseek_v3.args import DeepSeekV3Args
from kenotron.models.hf_adapter import HFAdapter, HFConversionError, require
from kenotron.models.llama3.hf import LLAMA_TOP_KEYS
from kenotron.models.qwen3_moe.hf import SWIGLU_EXPERT_KEYS

ATTENTION_KEYS = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
}
FFN_KEYS = {
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
    "feed_forward.router.gate.weight": "mlp.gate.weight",
    "feed_forward.router.expert_bias": "mlp.gate.e_score_correction_bias",
    "feed_forward.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}

MTP_KEYS = {
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "head_norm.weight": "shared_head.norm.weight",
}
"""An MTP module's own parts (it is block n_layers + k - 1 on both sides; its block's keys are the others)."""


def _query_rows(weight: torch.Tensor, args: DeepSeekV3Args, to_hf: bool) -> torch.Tensor:
    if not args.rope_interleave:
        return weight
    return deinterleave_rows(weight, args.nope_dim + args.rope_dim, args.nope_dim, args.rope_dim, to_hf)


def _latent_rows(weight: torch.Tensor, args: DeepSeekV3Args, to_hf: bool) -> torch.Tensor:
    if not args.rope_interleave:
        return weight
    return deinterleave_rows(weight, args.kv_rank + args.rope_dim, args.kv_rank, args.rope_dim, to_hf)


def _rope_from_config(config: dict[str, Any]) -> tuple[float, YarnScaling | None]:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise HFConversionError(f"config.json has rope type {rope_type!r}; kenotron's deepseek_v3 has 'default' and "
                                f"'yarn' (as the published checkpoints use)")
    if params.get("attention_factor") is not None:
        raise HFConversionError("config.json sets rope attention_factor; kenotron's YaRN derives it from mscale and "
                                "mscale_all_dim: remove it")
    return theta, YarnScaling(
        factor=float(params["factor"]), original_max_len=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
        mscale=float(params.get("mscale") or 0.0), mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
    )


def _rope_to_config(theta: float, scaling: YarnScaling | None) -> dict[str, Any]:
    if scaling is None:
        return {"rope_theta": theta, "rope_scaling": None}
    return {"rope_theta": theta, "rope_scaling": {
        "rope_type": "yarn", "factor": scaling.factor, "original_max_position_embeddings": scaling.original_max_len,
        "beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow, "mscale": scaling.mscale,
        "mscale_all_dim": scaling.mscale_all_dim,
    }}


def deepseek_v3_args_from_hf_config(config: dict[str, Any]) -> DeepSeekV3Args:
    require(config, "hidden_act", "silu", "the MLPs are SwiGLU")
    require(config, "attention_bias", False, "the projections have no bias")
    require(config, "moe_layer_freq", 1, "every block after the dense ones is an MoE block")
    require(config, "scoring_func", "sigmoid", "DeepseekV3ForCausalLM routes by sigmoid scores")
    require(config, "topk_method", "noaux_tc", "the routing is group-limited top-k over biased scores")
    n_heads = config["num_attention_heads"]
    require(config, "num_key_value_heads", n_heads, "MLA expands keys and values for every head")
    moe_ffn = config["moe_intermediate_size"]
    theta, scaling = _rope_from_config(config)
    moe = MoEArgs(
        n_experts=int(config.get("n_routed_experts") or config["num_local_experts"]),
        top_k=config["num_experts_per_tok"], ffn_dim=moe_ffn, score_func="sigmoid",
        norm_topk=bool(config.get("norm_topk_prob", True)), route_scale=float(config.get("routed_scaling_factor", 1.0)),
        shared_ffn_dim=int(config.get("n_shared_experts") or 0) * moe_ffn,
        n_groups=int(config.get("n_group") or 1), topk_groups=int(config.get("topk_group") or 1),
    )
    return DeepSeekV3Args(
        dim=config["hidden_size"], n_layers=config["num_hidden_layers"], n_heads=n_heads,
        q_rank=int(config.get("q_lora_rank") or 0), kv_rank=config["kv_lora_rank"],
        nope_dim=config["qk_nope_head_dim"], rope_dim=config["qk_rope_head_dim"], v_dim=config["v_head_dim"],
        ffn_dim=config["intermediate_size"], n_dense_layers=int(config.get("first_k_dense_replace") or 0), moe=moe,
        vocab_size=config["vocab_size"], norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=theta,
        rope_scaling=scaling, rope_interleave=bool(config.get("rope_interleave", True)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_seq_len=config.get("max_position_embeddings", 4096),
        mtp_depth=int(config.get("num_nextn_predict_layers") or config.get("num_mtp_layers") or 0),
    )


def check_deepseek_v3_export(args: DeepSeekV3Args) -> None:
    """What DeepseekV3ForCausalLM cannot hold: softmax routing, a shared width that is not whole experts."""
    moe = args.moe
    if moe.score_func != "sigmoid":
        raise HFConversionError(f"model.moe.score_func={moe.score_func!r}: DeepseekV3ForCausalLM routes by sigmoid "
                                f"scores only; this model cannot be exported to it")
    if moe.shared_ffn_dim % moe.ffn_dim or moe.shared_gate:
        raise HFConversionError(f"model.moe.shared_ffn_dim={moe.shared_ffn_dim} is not a whole number of experts of "
                                f"{moe.ffn_dim} (or has a gate): DeepseekV3ForCausalLM cannot hold it")


def hf_config_from_deepseek_v3_args(args: DeepSeekV3Args) -> dict[str, Any]:
    moe = args.moe
    return {
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_heads, "q_lora_rank": args.q_rank or None, "kv_lora_rank": args.kv_rank,
        "qk_nope_head_dim": args.nope_dim, "qk_rope_head_dim": args.rope_dim, "v_head_dim": args.v_dim,
        "intermediate_size": args.ffn_dim, "first_k_dense_replace": args.n_dense_layers,
        "moe_intermediate_size": moe.ffn_dim, "n_routed_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
        "n_shared_experts": moe.shared_ffn_dim // moe.ffn_dim, "norm_topk_prob": moe.norm_topk,
        "routed_scaling_factor": moe.route_scale, "n_group": moe.n_groups, "topk_group": moe.topk_groups,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
        "vocab_size": args.vocab_size, "rms_norm_eps": args.norm_eps, "hidden_act": "silu", "attention_bias": False,
        "rope_interleave": args.rope_interleave, "tie_word_embeddings": args.tie_embeddings,
        "max_position_embeddings": args.max_seq_len, "num_nextn_predict_layers": args.mtp_depth,
        **_rope_to_config(args.rope_theta, args.rope_scaling),
    }


DEEPSEEK_V3_HF_ADAPTER = HFAdapter(
    architecture="DeepseekV3ForCausalLM",
    model_type="deepseek_v3",
    top_keys=LLAMA_TOP_KEYS,
    layer_keys={**ATTENTION_KEYS, **FFN_KEYS, **MTP_KEYS},
    args_from_config=deepseek_v3_args_from_hf_config,
    config_from_args=hf_config_from_deepseek_v3_args,
    expert_keys=SWIGLU_EXPERT_KEYS,
    reorder={"attention.wq.weight": _query_rows, "attention.wq_b.weight": _query_rows,
             "attention.wkv_a.weight": _latent_rows},
    check_export=check_deepseek_v3_export,
    copied_layer_keys=("embed_tokens.weight", "shared_head.head.weight"),
)

