"""Llama 3 HF adapter: key/config round trips, and logits equal to transformers' LlamaForCausalLM."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kenotron.models import get_model_spec
from kenotron.models.common.rope_scaling import RopeScaling
from kenotron.models.hf_adapter import HFConversionError
from kenotron.models.llama3 import Llama3Args
from tests.models.hf_parity import (
    hf_model,
    max_logit_diff,
    random_hf_model,
    random_kenotron_model,
)

SPEC = get_model_spec("llama3")
ADAPTER = SPEC.hf_adapter
# original_max_len 64 puts some of head_dim 16's frequencies in each band of the Llama 3.1 scaling.
SMALL = Llama3Args(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=128, rope_theta=500000.0,
    rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=64),
    max_seq_len=128,
)


def test_config_round_trip_keeps_every_field():
    for args in (SMALL, dataclasses.replace(SMALL, rope_scaling=None, tie_embeddings=True), SPEC.flavors["8B"]):
        assert ADAPTER.args_from_hf_config(ADAPTER.hf_config_from_args(args)) == args


def test_published_8b_config_gives_the_8b_flavor():
    config = {  # Llama-3.1-8B's config.json, the fields that matter
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    }
    assert ADAPTER.args_from_hf_config(config, max_seq_len=8192) == SPEC.flavors["8B"]


def test_unsupported_config_values_are_named():
    config = ADAPTER.hf_config_from_args(SMALL)
    with pytest.raises(HFConversionError, match="attention_bias=True"):
        ADAPTER.args_from_hf_config({**config, "attention_bias": True})
    with pytest.raises(HFConversionError, match="rope type 'yarn'"):
        ADAPTER.args_from_hf_config({**config, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(HFConversionError, match="model_type='qwen2'"):
        ADAPTER.args_from_hf_config({**config, "model_type": "qwen2"})


def test_keys_map_both_ways_and_unknown_keys_are_named():
    model = random_kenotron_model(SPEC, SMALL)
    for key in model.state_dict():
        assert ADAPTER.from_hf_key(ADAPTER.to_hf_key(key)) == key
    assert ADAPTER.to_hf_key("layers.1.attention.wq.weight") == "model.layers.1.self_attn.q_proj.weight"
    with pytest.raises(HFConversionError, match="'model.layers.0.mlp.fc1.weight'"):
        ADAPTER.from_hf_key("model.layers.0.mlp.fc1.weight")


def test_tied_export_has_no_lm_head_and_import_ties_it():
    args = dataclasses.replace(SMALL, tie_embeddings=True)
    model = random_kenotron_model(SPEC, args)
    hf_sd = ADAPTER.to_hf(model.state_dict(), args)
    assert "lm_head.weight" not in hf_sd
    back = ADAPTER.from_hf(hf_sd, args)
    assert back["output.weight"] is back["tok_embeddings.weight"]
    assert back.keys() == model.state_dict().keys()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("scaling", [True, False], ids=["llama3_rope_scaling", "plain_rope"])
def test_logits_equal_transformers_both_directions(tied, scaling):
    pytest.importorskip("transformers")
    args = dataclasses.replace(SMALL, tie_embeddings=tied, rope_scaling=SMALL.rope_scaling if scaling else None)
    tokens = torch.randint(0, args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))

    ours = random_kenotron_model(SPEC, args)
    theirs = hf_model(SPEC, args)
    missing, unexpected = theirs.load_state_dict(ADAPTER.to_hf(ours.state_dict(), args), strict=False)
    assert set(missing) <= ({"lm_head.weight"} if tied else set()) and not unexpected
    assert max_logit_diff(ours, theirs, tokens) < 1e-4

    theirs = random_hf_model(SPEC, args, seed=1)
    ours = random_kenotron_model(SPEC, args)
    ours.load_state_dict(ADAPTER.from_hf(theirs.state_dict(), args), strict=True)
    assert max_logit_diff(ours, theirs, tokens) < 1e-4
