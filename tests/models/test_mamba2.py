"""Mamba-2: the chunked scan against the recurrence it computes, the flavors against transformers'
parameter counts, causality, the published init of A_log / dt bias / D, layout-invariant
seeding, hybrids, and the adapter's logit parity with transformers' Mamba2ForCausalLM."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kenotron.errors import ConfigError
from kenotron.models import get_model_spec
from kenotron.models.common.ssd import ssd_chunked, ssd_step
from kenotron.models.hf_adapter import HFConversionError
from kenotron.models.mamba2 import Mamba2Args
from kenotron.models.mamba2.hf import regroup
from tests.models.hf_parity import (
    hf_model,
    max_logit_diff,
    needs_grouped_mamba2_norm,
    random_hf_model,
    random_kenotron_model,
)

SPEC = get_model_spec("mamba2")
# Two B/C groups (so the adapter's reordering is exercised), chunks shorter than the sequence.
SMALL = Mamba2Args(dim=64, n_layers=2, vocab_size=128, ssm_state=16, ssm_head_dim=16, ssm_groups=2, chunk_size=16,
                   tie_embeddings=False, max_seq_len=64)


def scan_inputs(b=2, length=37, heads=4, head_dim=8, groups=2, state=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, heads, head_dim, generator=g, dtype=torch.float64)
    dt = torch.randn(b, length, heads, generator=g, dtype=torch.float64)
    A = -torch.rand(heads, generator=g, dtype=torch.float64) * 3
    B = torch.randn(b, length, groups, state, generator=g, dtype=torch.float64)
    C = torch.randn(b, length, groups, state, generator=g, dtype=torch.float64)
    D = torch.randn(heads, generator=g, dtype=torch.float64)
    bias = torch.randn(heads, generator=g, dtype=torch.float64)
    return x, dt, A, B, C, D, bias


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_chunked_scan_equals_the_recurrence_with_an_initial_state(chunk):
    # 37 positions: the last chunk is partial; chunk 64 holds the whole sequence in one.
    x, dt, A, B, C, D, bias = scan_inputs()
    init = torch.randn(2, 4, 8, 5, dtype=torch.float64)
    y, final = ssd_chunked(x, dt, A, B, C, D, bias, chunk, initial_state=init, return_final_state=True)
    state = init.clone()
    ref = torch.stack([ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D, bias) for t in range(37)], 1)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)  # fp32 inside
    torch.testing.assert_close(final.double(), state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flavor", ["130M", "370M", "780M", "1.3B", "2.7B"])
def test_parameter_count_equals_transformers_model_of_the_same_config(flavor):
    transformers = pytest.importorskip("transformers")
    args = SPEC.model_args(flavor, max_seq_len=16)
    with torch.device("meta"):
        ours = SPEC.build(args)
        config = transformers.AutoConfig.for_model(**SPEC.hf_adapter.hf_config_from_args(args))
        theirs = transformers.Mamba2ForCausalLM(config)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    published = {"130M": 130e6, "370M": 370e6, "780M": 780e6, "1.3B": 1.3e9, "2.7B": 2.7e9}[flavor]
    assert abs(count / published - 1) < 0.05


def debug_model(flavor="debug", seed=0, **changes):
    args = dataclasses.replace(SPEC.model_args(flavor, max_seq_len=160), **changes)
    with torch.device("meta"):
        model = SPEC.build(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.eval()


@pytest.mark.parametrize("flavor", ["debug", "debug-hybrid"])
def test_debug_flavors_are_causal_over_several_chunks(flavor):
    model = debug_model(flavor)
    tokens = torch.randint(0, 4096, (2, 150), generator=torch.Generator().manual_seed(0))  # chunks of 32
    changed = tokens.clone()
    changed[:, 100:] = (changed[:, 100:] + 7) % 4096
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 150, 4096)
    torch.testing.assert_close(a[:, :100], b[:, :100], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 100:], b[:, 100:])


def test_hybrid_places_attention_blocks_at_its_indices():
    model = debug_model("debug-hybrid")
    kinds = [type(layer).__name__ for layer in model.layers.values()]
    assert kinds == ["MambaBlock", "MambaBlock", "DecoderBlock", "MambaBlock"]
    with pytest.raises(ConfigError, match=r"attention_layers=\[2\] names layer 2, but the model has 2 layers"):
        SPEC.model_args("debug-hybrid", n_layers=2)


def test_init_follows_mamba_ssm_and_is_seeded_per_parameter():
    model = debug_model(seed=3)
    ssm = model.layers["0"].mixer.ssm
    A = torch.exp(ssm.A_log)
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 1  # uniform on [1, 16]
    dt = torch.nn.functional.softplus(ssm.dt_bias)
    assert dt.min() >= 1e-3 - 1e-7 and dt.max() <= 0.1 + 1e-7
    assert torch.equal(ssm.D, torch.ones_like(ssm.D))
    assert not torch.equal(model.layers["0"].mixer.ssm.A_log, model.layers["1"].mixer.ssm.A_log)
    bound = 1 / math.sqrt(4)  # the convolution keeps nn.Conv1d's default
    conv = model.layers["0"].mixer.conv1d.weight
    assert conv.abs().max() <= bound and conv.abs().max() > 0.8 * bound
    again = debug_model(seed=3)
    for (name, a), b in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    assert model.output.weight is model.tok_embeddings.weight  # the published flavors tie them


def test_regroup_round_trips_and_is_identity_for_one_group():
    t = torch.arange(2 * 11 * 3).view(22, 3)
    assert torch.equal(regroup(regroup(t, 2, [4, 2, 5], to_hf=True), 2, [4, 2, 5], to_hf=False), t)
    hf = regroup(t, 2, [4, 2, 5], to_hf=True)
    assert torch.equal(hf[:8], torch.cat([t[0:4], t[11:15]]))  # segment 0 of both groups first
    assert regroup(t, 1, [22], to_hf=True) is t


def test_config_round_trip_keeps_every_field_hybrid_included():
    adapter = SPEC.hf_adapter
    for args in (SMALL, dataclasses.replace(SMALL, tie_embeddings=True), SPEC.model_args("debug-hybrid")):
        assert adapter.args_from_hf_config(adapter.hf_config_from_args(args)) == args


def test_hybrids_and_dt_limits_are_refused_by_the_adapter():
    adapter = SPEC.hf_adapter
    hybrid = SPEC.model_args("debug-hybrid")
    with pytest.raises(HFConversionError, match="hybrid .* has no transformers class"):
        adapter.to_hf(debug_model("debug-hybrid").state_dict(), hybrid)
    config = {**adapter.hf_config_from_args(SMALL), "time_step_limit": [0.0, 0.1]}
    with pytest.raises(HFConversionError, match="time_step_limit"):
        adapter.args_from_hf_config(config)


@needs_grouped_mamba2_norm
def test_logits_equal_transformers_both_directions():
    pytest.importorskip("transformers")
    adapter = SPEC.hf_adapter
    tokens = torch.randint(0, SMALL.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    ours = random_kenotron_model(SPEC, SMALL)
    theirs = hf_model(SPEC, SMALL)
    missing, unexpected = theirs.load_state_dict(adapter.to_hf(ours.state_dict(), SMALL), strict=False)
    assert not missing and not unexpected
    assert max_logit_diff(ours, theirs, tokens) < 1e-4

    theirs = random_hf_model(SPEC, SMALL, seed=1)
    ours.load_state_dict(adapter.from_hf(theirs.state_dict(), SMALL), strict=True)
    assert max_logit_diff(ours, theirs, tokens) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pytorch_scan_compiles_on_cuda_and_equals_itself_eager():
    # The chunked scan is the path of every GPU run whose sizes the Triton kernels do not take
    # (tuning.ssm_kernel = torch): torch.compile must take it whole and change nothing.
    inputs = [t.float().cuda().requires_grad_() for t in scan_inputs(length=300, heads=8, head_dim=16, state=32)]
    eager = ssd_chunked(*inputs, 64)
    compiled = torch.compile(ssd_chunked, fullgraph=True)(*inputs, 64)
    # Outputs reach ~160 here from terms that cancel: a fused kernel's other summation order
    # moves an output by fp32 rounding of that scale (an H200 run: 1 of 76,800 values off by
    # 1.9e-4, a tight absolute bound failing), so the bound follows the output's scale.
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5 * eager.abs().max().item())
    dy = torch.randn_like(eager)
    for got, want in zip(torch.autograd.grad(compiled, inputs, dy), torch.autograd.grad(eager, inputs, dy)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(want.abs().max().item(), 1.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_130m_block_with_the_pytorch_scan_compiles_on_cuda_and_equals_itself_eager():
    # tuning.ssm_kernel = torch inside a compiled block: the 130M shape (24 heads of 64, one
    # group, state 128, chunks of 256), whose within-chunk cumulative sum Inductor once failed
    # to generate code for (its split scan along an inner dimension).
    args = dataclasses.replace(SPEC.model_args("130M", max_seq_len=1024), n_layers=1, vocab_size=256)
    with torch.device("meta"):
        model = SPEC.build(args)
    model.to_empty(device="cuda")
    model.init_weights(seed=0)
    block = model.layers["0"]
    x = torch.randn(2, 1024, args.dim, device="cuda", requires_grad=True)
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4 * eager.abs().max().item())
    dy = torch.randn_like(eager)
    got = torch.autograd.grad(compiled, [x, *block.parameters()], dy)
    want = torch.autograd.grad(eager, [x, *block.parameters()], dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4 * max(w.abs().max().item(), 1.0))
