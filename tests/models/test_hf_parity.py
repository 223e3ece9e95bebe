"""HF adapters of Qwen2/2.5, Qwen3, Mistral and StarCoder2: config round trips, the published
config.json of one size per family, and logits equal to transformers' own classes in both
directions (random weights, fp32), sliding windows exercised by sequences longer than them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kenotron.models import get_model_spec
from kenotron.models.hf_adapter import HFConversionError
from kenotron.models.mistral import MistralArgs
from kenotron.models.qwen2 import Qwen2Args
from kenotron.models.qwen3 import Qwen3Args
from kenotron.models.starcoder2 import StarCoder2Args
from tests.models.hf_parity import (
    hf_model,
    max_logit_diff,
    random_hf_model,
    random_kenotron_model,
)

# Small random models; windows of 16 against sequences of 40.
SMALL = {
    "qwen2": Qwen2Args(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=128, max_seq_len=64),
    "qwen3": Qwen3Args(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=96, vocab_size=128, max_seq_len=64
    ),
    "mistral": MistralArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=128, sliding_window=16, max_seq_len=64
    ),
    "starcoder2": StarCoder2Args(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=128, sliding_window=16,
        rope_theta=10000.0, max_seq_len=64,
    ),
}

# The fields that matter of each family's published config.json, and the flavor it is.
PUBLISHED = {
    ("qwen2", "7B"): {  # Qwen2.5-7B
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064,
    },
    ("qwen3", "0.6B"): {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
    ("mistral", "7B-v0.1"): {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000,
    },
    ("starcoder2", "3B"): {
        "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 3072, "intermediate_size": 12288, "max_position_embeddings": 16384,
        "num_attention_heads": 24, "num_hidden_layers": 30, "num_key_value_heads": 2, "norm_epsilon": 1e-05,
        "rope_theta": 999999.4420358813, "sliding_window": 4096, "use_bias": True, "vocab_size": 49152,
    },
}


@pytest.mark.parametrize("family", sorted(SMALL))
def test_config_round_trip_keeps_every_field(family):
    adapter = get_model_spec(family).hf_adapter
    args = SMALL[family]
    for variant in (args, dataclasses.replace(args, tie_embeddings=not args.tie_embeddings)):
        assert adapter.args_from_hf_config(adapter.hf_config_from_args(variant)) == variant


@pytest.mark.parametrize(("family", "flavor"), sorted(PUBLISHED))
def test_published_config_gives_the_flavor(family, flavor):
    spec = get_model_spec(family)
    args = spec.hf_adapter.args_from_hf_config(PUBLISHED[family, flavor], max_seq_len=4096)
    assert args == spec.model_args(flavor, max_seq_len=4096)


def test_unsupported_settings_are_refused_with_the_key_named():
    qwen2 = get_model_spec("qwen2").hf_adapter
    with pytest.raises(HFConversionError, match="use_sliding_window=True"):
        qwen2.args_from_hf_config({**PUBLISHED["qwen2", "7B"], "use_sliding_window": True})
    with pytest.raises(HFConversionError, match="head_dim=128 but kenotron's mistral derives"):
        get_model_spec("mistral").hf_adapter.args_from_hf_config(
            {**PUBLISHED["mistral", "7B-v0.1"], "hidden_size": 5120, "head_dim": 128}
        )
    with pytest.raises(HFConversionError, match="hidden_act='gelu'"):
        get_model_spec("starcoder2").hf_adapter.args_from_hf_config(
            {**PUBLISHED["starcoder2", "3B"], "hidden_act": "gelu"}
        )


@pytest.mark.parametrize("family", sorted(SMALL))
def test_every_parameter_has_an_hf_name_and_back(family):
    spec = get_model_spec(family)
    model = random_kenotron_model(spec, SMALL[family])
    for key in model.state_dict():
        assert spec.hf_adapter.from_hf_key(spec.hf_adapter.to_hf_key(key)) == key


@pytest.mark.parametrize("family", sorted(SMALL))
def test_logits_equal_transformers_both_directions(family):
    pytest.importorskip("transformers")
    spec = get_model_spec(family)
    adapter = spec.hf_adapter
    args = SMALL[family]
    tokens = torch.randint(0, args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))

    ours = random_kenotron_model(spec, args)
    theirs = hf_model(spec, args)
    missing, unexpected = theirs.load_state_dict(adapter.to_hf(ours.state_dict(), args), strict=False)
    assert set(missing) <= ({"lm_head.weight"} if args.tie_embeddings else set()) and not unexpected
    assert max_logit_diff(ours, theirs, tokens) < 1e-4

    theirs = random_hf_model(spec, args, seed=1)
    ours.load_state_dict(adapter.from_hf(theirs.state_dict(), args), strict=True)
    assert max_logit_diff(ours, theirs, tokens) < 1e-4


@pytest.mark.parametrize("family", ["mistral", "starcoder2"])
def test_the_window_matters_in_the_parity_sequence(family):
    # Guards the test above: with the window off, the same weights give other logits.
    spec = get_model_spec(family)
    args = SMALL[family]
    tokens = torch.randint(0, args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    windowed = random_kenotron_model(spec, args)
    full = random_kenotron_model(spec, dataclasses.replace(args, sliding_window=None))
    with torch.no_grad():
        assert (windowed(tokens) - full(tokens)).abs().max() > 1e-2
