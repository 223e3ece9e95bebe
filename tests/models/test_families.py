"""Qwen2/2.5, Qwen3, Mistral, StarCoder2: real parameter counts, shapes, causality, sliding
windows, the mask-free fast path, and that each family keeps Llama's parameter names."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kenotron.models import get_model_spec

# Published totals of the released checkpoints (the safetensors' parameter counts).
REAL_PARAM_COUNTS = {
    ("qwen2", "0.5B"): 494_032_768,  # Qwen2.5-0.5B (tied)
    ("qwen2", "7B"): 7_615_616_512,  # Qwen2.5-7B
    ("qwen2", "72B"): 72_706_203_648,  # Qwen2.5-72B
    ("qwen3", "0.6B"): 596_049_920,  # Qwen3-0.6B (tied)
    ("qwen3", "8B"): 8_190_735_360,  # Qwen3-8B
    ("qwen3", "32B"): 32_762_123_264,  # Qwen3-32B
    ("mistral", "7B-v0.1"): 7_241_732_096,
    ("mistral", "7B-v0.3"): 7_248_023_552,
    ("starcoder2", "3B"): 3_030_371_328,  # tied
    ("starcoder2", "15B"): 15_957_889_024,  # untied
}
FAMILIES = ["qwen2", "qwen3", "mistral", "starcoder2", "deepseek_v3"]


def debug_model(family: str, seed: int = 0, **changes) -> torch.nn.Module:
    spec = get_model_spec(family)
    args = dataclasses.replace(spec.model_args("debug", max_seq_len=64), **changes)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.eval()


@pytest.mark.parametrize(("family", "flavor"), sorted(REAL_PARAM_COUNTS))
def test_parameter_count_on_meta_equals_the_released_model(family, flavor):
    spec = get_model_spec(family)
    with torch.device("meta"):
        model = spec.build(spec.model_args(flavor, max_seq_len=16))
    assert sum(p.numel() for p in model.parameters()) == REAL_PARAM_COUNTS[family, flavor]


@pytest.mark.parametrize("family", FAMILIES)
def test_debug_flavor_gives_logits_of_the_builtin_vocabulary_and_is_causal(family):
    model = debug_model(family)
    tokens = torch.randint(0, 4096, (2, 48), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 30:] = (changed[:, 30:] + 7) % 4096
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 48, 4096) and a.dtype == torch.float32
    torch.testing.assert_close(a[:, :30], b[:, :30], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 30:], b[:, 30:])


@pytest.mark.parametrize("family", ["mistral", "starcoder2"])
def test_sliding_window_hides_tokens_further_back_than_the_window(family):
    # One block: the logit at position p depends on positions p-7 .. p only (window 8).
    model = debug_model(family, n_layers=1, sliding_window=8)
    tokens = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 4096
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    diff = (a - b).abs().amax(dim=-1)[0]
    assert torch.all(diff[:10] == 0) and torch.all(diff[10:18] > 0) and torch.all(diff[18:] < 1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_path_uses_no_mask_unless_the_sequence_exceeds_the_window(family):
    model = debug_model(family)
    cpu = torch.device("cpu")
    window = model.sliding_window
    assert model._attention_mask(64, None, None, None, cpu) is None
    if window is not None:
        assert model._attention_mask(window, None, None, None, cpu) is None
        assert model._attention_mask(window + 1, None, None, None, cpu).shape == (1, 1, window + 1, window + 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_init_is_reproducible_and_tied_embeddings_share_one_tensor(family):
    a, b = debug_model(family, seed=5), debug_model(family, seed=5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    if a.args.tie_embeddings:
        assert a.output.weight is a.tok_embeddings.weight


def test_families_keep_llama_parameter_names_where_roles_match():
    llama = set(dict(debug_model_names("llama3")))
    for family in ["qwen2", "qwen3", "mistral"]:
        names = set(dict(debug_model_names(family)))
        extra = {n.split(".", 2)[-1] for n in names - llama}
        assert llama - names <= {"output.weight"}, family  # tied output has no own tensor
        assert extra <= {
            "attention.wq.bias", "attention.wk.bias", "attention.wv.bias",
            "attention.q_norm.weight", "attention.k_norm.weight",
        }, family
    starcoder = {n for n, _ in debug_model_names("starcoder2")}
    assert "layers.0.feed_forward.w1.bias" in starcoder and "layers.0.feed_forward.w3.weight" not in starcoder


def debug_model_names(family: str) -> list[tuple[str, tuple[int, ...]]]:
    spec = get_model_spec(family)
    with torch.device("meta"):
        model = spec.build(spec.model_args("debug", max_seq_len=16))
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def test_qwen3_head_dim_is_decoupled_from_the_width():
    model = debug_model("qwen3")
    attn = model.layers["0"].attention
    assert attn.wq.weight.shape == (8 * 64, 256) and attn.q_norm.weight.shape == (64,)
