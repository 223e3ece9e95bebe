"""Llama 3: shapes, causality, init determinism, real parameter counts, RoPE scaling."""

from __future__ import annotations

import math

import pytest
import torch

from kenotron.models import UnknownModelError, get_model_spec
from kenotron.models.common.rope import rope_inv_freq
from kenotron.models.common.rope_scaling import RopeScaling

SPEC = get_model_spec("llama3")

# Published parameter counts of the released checkpoints.
REAL_PARAM_COUNTS = {
    "1B": 1_235_814_400,
    "3B": 3_212_749_824,
    "8B": 8_030_261_248,
    "70B": 70_553_706_496,
    "405B": 405_853_388_800,
}


def tiny_model(seed: int = 0, **changes) -> torch.nn.Module:
    args = SPEC.model_args("debug", max_seq_len=32)
    if changes:
        import dataclasses

        args = dataclasses.replace(args, **changes)
    with torch.device("meta"):
        model = SPEC.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


@pytest.mark.parametrize("flavor", sorted(REAL_PARAM_COUNTS))
def test_parameter_count_on_meta_equals_the_released_model(flavor):
    with torch.device("meta"):
        model = SPEC.build(SPEC.model_args(flavor, max_seq_len=16))
    assert sum(p.numel() for p in model.parameters()) == REAL_PARAM_COUNTS[flavor]
    assert all(p.is_meta for p in model.parameters())


def test_logits_shape_and_dtype():
    model = tiny_model()
    tokens = torch.randint(0, 4096, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, 4096)
    assert logits.dtype == torch.float32


def test_changing_a_later_token_never_changes_earlier_logits():
    model = tiny_model()
    tokens = torch.randint(0, 4096, (1, 32))
    changed = tokens.clone()
    changed[0, 20:] = (changed[0, 20:] + 7) % 4096
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_init_is_reproducible_from_the_seed_and_differs_across_seeds():
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if pa.ndim == 2:
            assert not torch.equal(pa, pc), name


def test_tied_embeddings_share_one_tensor():
    model = tiny_model(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight
    n_untied = sum(p.numel() for p in tiny_model().parameters())
    assert n_untied - sum(p.numel() for p in model.parameters()) == 4096 * 256


def test_grouped_query_attention_equals_repeated_kv_heads():
    model = tiny_model()
    attn = model.layers["0"].attention
    x = torch.randn(2, 16, 256)
    cos, sin = model.rope_cos[:16], model.rope_sin[:16]
    out = attn(x, cos, sin)
    # Reference: expand the 4 kv heads to 8 by repetition and run plain multi-head attention.
    from kenotron.models.common.rope import apply_rope

    q = apply_rope(attn.wq(x).view(2, 16, 8, 32), cos, sin).transpose(1, 2)
    k = apply_rope(attn.wk(x).view(2, 16, 4, 32), cos, sin).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attn.wv(x).view(2, 16, 4, 32).transpose(1, 2).repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(32)
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    ref = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 16, 256))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rope_llama31_scaling_keeps_short_and_scales_long_wavelengths():
    scaling = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)
    plain = rope_inv_freq(128, 500000.0, None)
    scaled = rope_inv_freq(128, 500000.0, scaling)
    wavelen = 2 * math.pi / plain
    short = wavelen < 8192 / 4
    long = wavelen > 8192 / 1
    torch.testing.assert_close(scaled[short], plain[short])
    torch.testing.assert_close(scaled[long], plain[long] / 8)
    mid = ~short & ~long
    assert mid.any()
    assert torch.all(scaled[mid] < plain[mid]) and torch.all(scaled[mid] > plain[mid] / 8)


def test_rope_positions_argument_matches_slicing():
    model = tiny_model()
    tokens = torch.randint(0, 4096, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model(tokens, positions=torch.arange(16)))


def test_unknown_flavor_lists_the_valid_ones():
    with pytest.raises(UnknownModelError, match=r"model.flavor='9B' is not a llama3 flavor; use one of debug, 1B"):
        SPEC.model_args("9B")
    with pytest.raises(UnknownModelError, match=r"model.name='gpt5'"):
        get_model_spec("gpt5")


def test_overrides_of_vocab_and_depth():
    args = SPEC.model_args("8B", vocab_size=1024, n_layers=2, max_seq_len=64)
    assert (args.vocab_size, args.n_layers, args.max_seq_len, args.dim) == (1024, 2, 64, 4096)


def test_init_of_a_partial_model_equals_the_same_blocks_of_the_whole_model():
    # A pipeline stage holds only some blocks; its weights must not depend on that.
    whole = tiny_model(seed=3)
    args = SPEC.model_args("debug", max_seq_len=32)
    with torch.device("meta"):
        stage = SPEC.build(args)
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = None
    stage.to_empty(device="cpu")
    stage.init_weights(seed=3)
    whole_params = dict(whole.named_parameters())
    for name, p in stage.named_parameters():
        assert torch.equal(p, whole_params[name]), name
