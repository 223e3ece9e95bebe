"""The MoE families (qwen3_moe, mixtral, qwen2_moe): HF adapters both ways through the hub's
per-expert layout, logits equal to transformers' own classes (random small configs, fp32,
1e-4) including routers and shared experts, published configs giving the flavors, the
refusals, and generation with the KV cache."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kenotron.checkpoint.hf import load_hf_model, save_hf
from kenotron.models import get_model_spec
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.hf_adapter import HFConversionError
from tests.models.hf_parity import random_hf_model, random_kenotron_model

SMALL_MOE = MoEArgs(n_experts=4, top_k=2, ffn_dim=32)
SMALL = {
    "qwen3_moe": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "vocab_size": 128, "max_seq_len": 64,
                      "moe": SMALL_MOE},
    "mixtral": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "max_seq_len": 64, "moe": SMALL_MOE},
    "qwen2_moe": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "max_seq_len": 64,
                      "moe": dataclasses.replace(SMALL_MOE, norm_topk=False, shared_ffn_dim=48, shared_gate=True)},
}

PUBLISHED = {
    ("qwen3_moe", "30B-A3B"): {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "tie_word_embeddings": False, "use_sliding_window": False,
        "vocab_size": 151936,
    },
    ("mixtral", "8x7B"): {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
        "tie_word_embeddings": False, "vocab_size": 32000,
    },
    ("qwen2_moe", "57B-A14B"): {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
        "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 32768,
        "mlp_only_layers": [], "moe_intermediate_size": 2560, "norm_topk_prob": False, "num_attention_heads": 28,
        "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "shared_expert_intermediate_size": 20480,
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
    },
}


def small_args(family: str):
    spec = get_model_spec(family)
    return dataclasses.replace(spec.flavors["debug"], **SMALL[family])


@pytest.mark.parametrize("family", sorted(SMALL))
def test_config_round_trip_keeps_every_field(family):
    adapter = get_model_spec(family).hf_adapter
    args = small_args(family)
    assert adapter.args_from_hf_config(adapter.hf_config_from_args(args)) == args


@pytest.mark.parametrize(("family", "flavor"), sorted(PUBLISHED))
def test_published_config_gives_the_flavor(family, flavor):
    spec = get_model_spec(family)
    assert spec.hf_adapter.args_from_hf_config(PUBLISHED[family, flavor], max_seq_len=4096) == spec.model_args(
        flavor, max_seq_len=4096)


def test_the_flavors_have_their_published_sizes():
    counts = {}
    for family, flavor in [("qwen3_moe", "30B-A3B"), ("mixtral", "8x7B"), ("qwen2_moe", "57B-A14B")]:
        spec = get_model_spec(family)
        with torch.device("meta"):
            counts[flavor] = sum(p.numel() for p in spec.build(spec.model_args(flavor)).parameters())
    assert round(counts["30B-A3B"] / 1e9, 1) == 30.5
    assert round(counts["8x7B"] / 1e9, 1) == 46.7
    assert round(counts["57B-A14B"] / 1e9, 1) == 57.4


@pytest.mark.parametrize("family", sorted(SMALL))
def test_logits_equal_transformers_both_ways_through_the_hub_layout(family, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = get_model_spec(family)
    args = small_args(family)
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    ours = random_kenotron_model(spec, args)
    save_hf(ours, tmp_path / "ours", spec=spec, args=args)
    theirs = getattr(transformers, spec.hf_adapter.architecture).from_pretrained(
        tmp_path / "ours", attn_implementation="eager").float().eval()
    with torch.no_grad():
        assert (ours(tokens) - theirs(input_ids=tokens).logits).abs().max() < 1e-4

    theirs = random_hf_model(spec, args, seed=1)
    theirs.save_pretrained(tmp_path / "theirs")  # per-expert keys, as on the hub
    back = load_hf_model(tmp_path / "theirs", max_seq_len=64)
    with torch.no_grad():
        assert (back(tokens) - theirs(input_ids=tokens).logits).abs().max() < 1e-4


def test_stacked_experts_split_into_views_and_stack_back():
    spec = get_model_spec("qwen2_moe")
    args = small_args("qwen2_moe")
    model = random_kenotron_model(spec, args)
    hf = spec.hf_adapter.to_hf(model.state_dict(), args)
    w13 = model.layers["1"].feed_forward.experts.w13
    gate = hf["model.layers.1.mlp.experts.3.gate_proj.weight"]
    assert gate.data_ptr() == w13[3].data_ptr() and torch.equal(gate, w13[3, :32])
    assert "layers.1.feed_forward.router.expert_bias" not in str(list(hf))
    back = spec.hf_adapter.from_hf(hf, args)
    assert set(back) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(back[key], value), key


def test_a_trained_expert_bias_refuses_export_and_a_missing_expert_refuses_import():
    spec = get_model_spec("mixtral")
    args = small_args("mixtral")
    model = random_kenotron_model(spec, args)
    state = dict(model.state_dict())
    hf = spec.hf_adapter.to_hf(state, args)
    del hf["model.layers.0.block_sparse_moe.experts.3.w2.weight"]
    with pytest.raises(HFConversionError, match="lacks part 1|lacks experts"):
        spec.hf_adapter.from_hf(hf, args)
    more = dataclasses.replace(args, moe=dataclasses.replace(args.moe, n_experts=8))
    with pytest.raises(HFConversionError, match="expert count differs"):
        spec.hf_adapter.from_hf(spec.hf_adapter.to_hf(state, args), more)
    state["layers.0.feed_forward.router.expert_bias"] = torch.full((4,), 0.1)
    with pytest.raises(HFConversionError, match="trained with an expert bias"):
        spec.hf_adapter.to_hf(state, args)


def test_configs_with_dense_layers_between_the_moe_ones_are_refused():
    adapter = get_model_spec("qwen3_moe").hf_adapter
    config = PUBLISHED["qwen3_moe", "30B-A3B"]
    with pytest.raises(HFConversionError, match="decoder_sparse_step=2"):
        adapter.args_from_hf_config({**config, "decoder_sparse_step": 2})
    with pytest.raises(HFConversionError, match="mlp_only_layers"):
        adapter.args_from_hf_config({**config, "mlp_only_layers": [0]})


def test_greedy_generation_with_the_cache_equals_without():
    # One family: the MoE layer is the same in all three (qwen2_moe adds the gated shared expert).
    from kenotron.generate import build_kenotron_model, generate

    model = build_kenotron_model("qwen2_moe", "debug", max_seq_len=32, seed=1)
    prompts = [[5, 6, 7, 8], [1, 2, 3, 4, 9, 10]]
    cached = generate(model, prompts, max_new_tokens=5)
    assert cached == generate(model, prompts, max_new_tokens=5, use_cache=False)
    assert all(len(row) == 5 for row in cached)


def test_hub_folder_to_dcp_checkpoint_and_back_keeps_every_expert(tmp_path):
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from kenotron.checkpoint.hf import checkpoint_to_hf, hf_to_checkpoint

    spec = get_model_spec("qwen2_moe")
    args = small_args("qwen2_moe")
    random_hf_model(spec, args, seed=2).save_pretrained(tmp_path / "hub")
    step = hf_to_checkpoint(tmp_path / "hub", tmp_path / "ckpt")
    checkpoint_to_hf(step, tmp_path / "back", max_shard_bytes=200_000)  # several shards: experts split across them

    def tensors(folder):
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    original, back = tensors(tmp_path / "hub"), tensors(tmp_path / "back")
    assert set(back) == set(original)
    assert all(torch.equal(back[k], original[k]) for k in original)
