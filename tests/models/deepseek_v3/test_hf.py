"""deepseek_v3 against transformers' DeepseekV3ForCausalLM: parameter counts (small configs and the
published ones), logits both ways through the hub's layout (every feature on: query low rank,
expert groups, shared experts, dense first blocks, YaRN, interleaved RoPE rows), published
config.json files giving the flavors, the refusals, and generation with the latent cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kenotron.checkpoint.hf import load_hf_model, save_hf
from kenotron.models import get_model_spec
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.rope_scaling import YarnScaling
from kenotron.models.hf_adapter import HFConversionError
from tests.models.hf_parity import random_hf_model, random_kenotron_model

SPEC = get_model_spec("deepseek_v3")
# Every feature on; YaRN's original context (8) shorter than the 24-token test sequences.
SMALL = dataclasses.replace(
    SPEC.flavors["debug"], dim=64, n_layers=3, n_heads=4, q_rank=32, kv_rank=24, nope_dim=16, rope_dim=8, v_dim=12,
    ffn_dim=96, n_dense_layers=1, vocab_size=128, max_seq_len=64,
    moe=MoEArgs(n_experts=8, top_k=3, ffn_dim=32, score_func="sigmoid", norm_topk=True, route_scale=2.5,
                shared_ffn_dim=64, n_groups=4, topk_groups=2),
    rope_scaling=YarnScaling(factor=4.0, original_max_len=8, mscale=1.0, mscale_all_dim=0.707),
)

PUBLISHED = {
    "671B": {  # deepseek-ai/DeepSeek-V3 config.json (the fields that matter)
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280,
    },
    "moonlight": {  # moonshotai/Moonlight-16B-A3B config.json
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 1,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11264, "kv_lora_rank": 512,
        "max_position_embeddings": 8192, "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
        "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": True, "num_attention_heads": 16,
        "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "num_nextn_predict_layers": 0,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 50000.0, "routed_scaling_factor": 2.446, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "v_head_dim": 128,
        "vocab_size": 163840,
    },
}


def hf_param_count(args) -> int:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**SPEC.hf_adapter.hf_config_from_args(args))
    with torch.device("meta"):
        return sum(p.numel() for p in transformers.DeepseekV3ForCausalLM(config).parameters())


def kenotron_param_count(args) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in SPEC.build(args).parameters())


@pytest.mark.parametrize("q_rank", [32, 0])
def test_parameter_count_equals_transformers_on_a_small_config(q_rank):
    args = dataclasses.replace(SMALL, q_rank=q_rank, mtp_depth=0)
    assert kenotron_param_count(args) == hf_param_count(args)


def test_parameter_count_equals_transformers_for_the_published_671b_and_moonlight():
    for flavor in ("671B", "moonlight"):
        args = dataclasses.replace(SPEC.model_args(flavor, max_seq_len=4096), mtp_depth=0)
        assert kenotron_param_count(args) == hf_param_count(args), flavor
    assert round(kenotron_param_count(dataclasses.replace(SPEC.flavors["671B"], mtp_depth=0)) / 1e9) == 671
    assert round(kenotron_param_count(SPEC.flavors["16B"]) / 1e9, 1) == 15.7  # DeepSeek-V2-Lite's, torchtitan's 16B


@pytest.mark.parametrize("flavor", sorted(PUBLISHED))
def test_published_config_gives_the_flavor(flavor):
    args = SPEC.hf_adapter.args_from_hf_config(PUBLISHED[flavor], max_seq_len=4096)
    assert args == SPEC.model_args(flavor, max_seq_len=4096)


def test_config_round_trip_keeps_every_field():
    for args in (SMALL, dataclasses.replace(SMALL, q_rank=0, rope_scaling=None, rope_interleave=False, mtp_depth=2)):
        assert SPEC.hf_adapter.args_from_hf_config(SPEC.hf_adapter.hf_config_from_args(args)) == args


@pytest.mark.parametrize("q_rank", [32, 0])
def test_logits_equal_transformers_both_ways_through_the_hub_layout(q_rank, tmp_path):
    transformers = pytest.importorskip("transformers")
    args = dataclasses.replace(SMALL, q_rank=q_rank)
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    ours = random_kenotron_model(SPEC, args)
    with torch.no_grad():  # a trained router bias: HF has it, so it converts
        for layer in ("1", "2"):
            ours.layers[layer].feed_forward.router.expert_bias.copy_(torch.randn(8) * 0.1)
    save_hf(ours, tmp_path / "ours", spec=SPEC, args=args)
    theirs = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    with torch.no_grad():
        assert (ours(tokens) - theirs(input_ids=tokens).logits).abs().max() < 1e-4

    theirs = random_hf_model(SPEC, args, seed=1)
    theirs.save_pretrained(tmp_path / "theirs")  # per-expert keys, as on the hub
    back = load_hf_model(tmp_path / "theirs", max_seq_len=64)
    with torch.no_grad():
        assert (back(tokens) - theirs(input_ids=tokens).logits).abs().max() < 1e-4


def test_unsupported_configs_and_exports_are_refused_naming_the_key():
    adapter = SPEC.hf_adapter
    with pytest.raises(HFConversionError, match="scoring_func='softmax'"):
        adapter.args_from_hf_config({**PUBLISHED["moonlight"], "scoring_func": "softmax"})
    with pytest.raises(HFConversionError, match="num_key_value_heads=8"):
        adapter.args_from_hf_config({**PUBLISHED["moonlight"], "num_key_value_heads": 8})
    with pytest.raises(HFConversionError, match="model_type='qwen3_moe'"):
        adapter.args_from_hf_config({**PUBLISHED["moonlight"], "model_type": "qwen3_moe"})
    with pytest.raises(HFConversionError, match="score_func='softmax'"):
        adapter.to_hf({}, SPEC.flavors["16B"])


def test_greedy_generation_with_the_latent_cache_equals_without():
    from kenotron.generate import build_kenotron_model, generate

    model = build_kenotron_model("deepseek_v3", "debug", max_seq_len=32, seed=1)
    cache = model.new_cache(2, 16)
    assert cache.latents[0].shape == (2, 16, 64) and cache.rope_keys[0].shape == (2, 16, 16)  # no per-head tensors
    prompts = [[5, 6, 7, 8], [1, 2, 3, 4, 9, 10]]
    cached = generate(model, prompts, max_new_tokens=5)
    assert cached == generate(model, prompts, max_new_tokens=5, use_cache=False)
    assert all(len(row) == 5 for row in cached)


def test_mtp_modules_convert_as_hf_layers_after_the_main_ones_both_ways():
    args = dataclasses.replace(SMALL, mtp_depth=1)
    model = random_kenotron_model(SPEC, args)
    hf = SPEC.hf_adapter.to_hf(model.state_dict(), args)
    for key in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                "self_attn.kv_a_proj_with_mqa.weight", "mlp.gate.e_score_correction_bias", "mlp.experts.7.down_proj.weight"):
        assert f"model.layers.3.{key}" in hf, key
    # Published checkpoints also hold copies of the embedding and the head in each MTP layer.
    hub = {**hf, "model.layers.3.embed_tokens.weight": hf["model.embed_tokens.weight"],
           "model.layers.3.shared_head.head.weight": hf["lm_head.weight"]}
    back = SPEC.hf_adapter.from_hf(hub, args)
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
