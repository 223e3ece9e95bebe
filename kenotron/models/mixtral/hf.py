"""Mixtral <-> transformers `MixtralForCausalLM`: key names and config.json.

The hub stores the MoE under `block_sparse_moe` with one w1 (gate), w3 (up), w2 (down) per
expert; kenotron stacks them (models/hf_experts.py).
"""

from __future__ import annotations

from typing import Any

from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.hf_adapter import HFAdapter
from kenotron.models.llama3.hf import LLAMA_TOP_KEYS
from kenotron.models.mistral.args import MistralArgs
from kenotron.models.mistral.hf import hf_config_from_mistral_args, mistral_args_from_hf_config
from kenotron.models.mixtral.args import MixtralArgs
from kenotron.models.qwen3_moe.hf import ATTENTION_KEYS, ROUTER_BIAS, dense_twin, with_experts

MIXTRAL_DEFAULTS = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-5}
"""Where Mixtral's config.json leaves these out, transformers' MixtralConfig values (not Mistral's)."""


def mixtral_args_from_hf_config(config: dict[str, Any]) -> MixtralArgs:
    # Mistral's decoder; its intermediate_size is the experts' width (Mixtral has no dense MLP).
    dense = mistral_args_from_hf_config({**MIXTRAL_DEFAULTS, **config}, family="mixtral")
    moe = MoEArgs(n_experts=config["num_local_experts"], top_k=config["num_experts_per_tok"], ffn_dim=dense.ffn_dim)
    return with_experts(dense, MixtralArgs, moe)


def hf_config_from_mixtral_args(args: MixtralArgs) -> dict[str, Any]:
    return {**hf_config_from_mistral_args(dense_twin(args, MistralArgs)), "num_local_experts": args.moe.n_experts,
            "num_experts_per_tok": args.moe.top_k}


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
