"""The flash-attn backend's plumbing, with a fake flash_attn module (the real one needs CUDA and
is not installed here): layout and dtype contract, grouped-query heads passed through, the
model equal to the SDPA model, FlashAttention-3 preferred on Hopper, a clear error without it."""

from __future__ import annotations

import sys

import pytest
import torch

from kenotron.kernel_choice.attention_backend import use_attention_kernel
from kenotron.models.common.attention import causal_attention
from kenotron.models.common.flash_attention import (
    FlashAttention,
    FlashAttnUnavailable,
    flash_attn_version,
    load_flash_attention,
)
from tests.models.fake_flash_attn import fake_flash_attn
from tests.models.tiny import tiny_model

SEQ = 24


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_model_with_flash_attn_equals_the_sdpa_model_in_bf16(family, monkeypatch):
    fake = fake_flash_attn()
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    reference, model = tiny_model(family, seq_len=SEQ).to(torch.bfloat16), tiny_model(family, seq_len=SEQ).to(torch.bfloat16)
    use_attention_kernel(model, "flash_attn", torch.device("cpu"))
    attention = model.layers["0"].attention
    assert isinstance(attention.attention_fn, FlashAttention) and attention.attention_fn.version == 2
    assert reference.layers["0"].attention.attention_fn is causal_attention
    tokens = torch.randint(0, 4096, (2, SEQ), generator=torch.Generator().manual_seed(0))
    out, want = model(tokens), reference(tokens)
    args = model.args
    # One call per layer, in flash-attn's layout, with the grouped k/v heads as they are.
    assert fake.calls == [((2, SEQ, args.n_heads, args.head_dim), (2, SEQ, args.n_kv_heads, args.head_dim))] * 2
    assert args.n_kv_heads < args.n_heads
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    out.float().square().mean().backward()
    want.float().square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=0, rtol=0, msg=name)


def test_fp32_inputs_break_the_contract(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    model = tiny_model(seq_len=SEQ)
    use_attention_kernel(model, "flash_attn", torch.device("cpu"))
    with pytest.raises(AssertionError, match="float32"):
        model(torch.randint(0, 4096, (1, SEQ)))


def test_masks_and_kv_cache_still_go_through_sdpa(monkeypatch):
    # Generation (KV cache) and windowed masks bypass attention_fn; flash_attn sees the
    # whole local sequence, so that bypass is allowed (unlike context parallel's).
    fake = fake_flash_attn()
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    reference, model = tiny_model(seq_len=SEQ), tiny_model(seq_len=SEQ)
    use_attention_kernel(model, "flash_attn", torch.device("cpu"))
    tokens = torch.randint(0, 4096, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, token_mask=mask), reference(tokens, token_mask=mask))
    assert fake.calls == []


def test_flash_attention_3_is_preferred_on_hopper_when_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # FlashAttention-3 absent
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # and FlashAttention-4
    assert load_flash_attention(9).version == 2
    fa3 = fake_flash_attn(name="flash_attn_interface", returns_lse=True)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fa3)
    kernel = load_flash_attention(9)
    assert kernel.version == 3 and kernel.func is fa3.flash_attn_func
    assert load_flash_attention(8).version == 2  # an Ampere GPU
    assert load_flash_attention(10).version == 2  # FlashAttention-3 is for SM90 only
    # A build that also returns the log-sum-exp still gives the attention output.
    q = torch.randn(1, 4, 8, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    out = kernel(q, k, k)
    torch.testing.assert_close(out, causal_attention(q, k, k))


def test_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # makes `import flash_attn` fail
    with pytest.raises(FlashAttnUnavailable, match=r"pip install flash-attn"):
        load_flash_attention(0)
    with pytest.raises(FlashAttnUnavailable, match=r"pip install flash-attn"):
        use_attention_kernel(tiny_model(seq_len=SEQ), "flash_attn", torch.device("cpu"))


def test_version_parsing():
    assert flash_attn_version(fake_flash_attn("2.7.4.post1")) == (2, 7)
    assert flash_attn_version(fake_flash_attn("2.6.3")) == (2, 6)
    assert flash_attn_version(fake_flash_attn("3.0.0b1")) == (3, 0)
