"""FlashAttention-4 through kenotron's custom ops, with a stand-in for FA4's kernels (the real ones
need an SM90+ GPU; tests/models/test_gpu_kernels.py runs them there): which FlashAttention is
picked per GPU, forward and gradients equal to SDPA's, a compiled block that traces the ops in
one graph, and the model equal to the SDPA model."""

from __future__ import annotations

import sys

import pytest
import torch

from kenotron.models.common.attention import GQAttention, causal_attention
from kenotron.models.common.flash_attention import (
    FlashAttention,
    FlashAttnUnavailable,
    load_flash_attention,
)
from kenotron.models.common.flash_attention4 import fa4_attention
from tests.models.fake_flash_attn import fake_flash_attn
from tests.models.fake_flash_attn4 import fake_flash_attn4
from tests.models.tiny import tiny_model

SEQ = 24


def _qkv(heads: int = 8, kv_heads: int = 2, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """q, k, v as GQAttention hands them: (b, h, s, d) views of (b, s, h, d) tensors."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, SEQ, h, 16, generator=g, dtype=dtype).transpose(1, 2).requires_grad_()
            for h in (heads, kv_heads, kv_heads)]


def _use_fa4(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, GQAttention):
            module.attention_fn = FlashAttention(fa4_attention, 4)


def test_fa4_is_picked_on_sm90_without_fa3_and_on_sm100(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # no FlashAttention-3
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake_flash_attn4())
    assert load_flash_attention(9).version == 4
    assert load_flash_attention(10).version == 4
    assert load_flash_attention(8).version == 2  # FA4 has no SM80 kernels here
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fake_flash_attn(name="flash_attn_interface"))
    assert load_flash_attention(9).version == 3  # FA3 first on Hopper
    assert load_flash_attention(10).version == 4
    # FA4 alone (its wheel installs flash_attn/cute/ only): no FlashAttention-2 to fall back to.
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    assert load_flash_attention(10).version == 4
    with pytest.raises(FlashAttnUnavailable, match="flash-attn-4"):
        load_flash_attention(8)


def test_fa4_ops_give_sdpa_output_and_gradients_with_grouped_heads(monkeypatch):
    fake = fake_flash_attn4(dtypes=(torch.float32,))  # fp32, to compare at fp32 precision
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake)
    q, k, v = _qkv()
    rq, rk, rv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    kernel = FlashAttention(fa4_attention, 4)
    out, want = kernel(q, k, v), causal_attention(rq, rk, rv)
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad)
    for got, ref, name in ((q, rq, "q"), (k, rk, "k"), (v, rv, "v")):
        assert got.grad.shape == ref.grad.shape, name  # k and v keep their 2 heads
        torch.testing.assert_close(got.grad, ref.grad, msg=name)
    # One forward and one backward kernel, on the grouped k/v as they are (nothing repeated).
    assert fake.calls == [("fwd", (2, SEQ, 8, 16), (2, SEQ, 2, 16)), ("bwd", (2, SEQ, 8, 16), (2, SEQ, 2, 16))]


def test_fa4_ops_trace_into_one_compiled_graph(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake_flash_attn4(dtypes=(torch.float32,)))
    kernel = FlashAttention(fa4_attention, 4)
    q, k, v = _qkv()
    rq, rk, rv = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def attend(q, k, v):
        return kernel(q * 1.5, k, v).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")  # fullgraph: no graph break
    compiled(q, k, v).backward()
    attend(rq, rk, rv).backward()
    for got, ref in ((q, rq), (k, rk), (v, rv)):
        torch.testing.assert_close(got.grad, ref.grad)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_model_with_fa4_equals_the_sdpa_model(family, monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake_flash_attn4(dtypes=(torch.float32,)))
    reference, model = tiny_model(family, seq_len=SEQ), tiny_model(family, seq_len=SEQ)
    _use_fa4(model)
    tokens = torch.randint(0, 4096, (2, SEQ), generator=torch.Generator().manual_seed(0))
    out, want = model(tokens), reference(tokens)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-5)
    out.float().square().mean().backward()
    want.float().square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=1e-4, msg=name)


def test_fa4_refuses_non_causal_attention():
    q, k, v = (t.detach() for t in _qkv())
    with pytest.raises(ValueError, match="causal attention only"):
        fa4_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False)


def _real_fa4_usable() -> bool:
    from kenotron.models.common.flash_attention4 import import_fa4

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9 and import_fa4() is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _real_fa4_usable(), reason="needs an SM90+ CUDA device and the flash-attn-4 package")
def test_real_fa4_in_bf16_matches_fp32_sdpa_eager_and_compiled():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    shapes = [(2, 512, h, 64) for h in (8, 2, 2)] + [(1, 1024, h, 128) for h in (8, 8, 8)]
    for group in (shapes[:3], shapes[3:]):
        q, k, v = (torch.randn(*s, generator=g, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                   for s in group)
        ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
        want = causal_attention(*ref)
        dout = torch.randn_like(want)
        want.backward(dout)
        kernel = FlashAttention(fa4_attention, 4)
        for fn in (kernel, torch.compile(kernel, fullgraph=True)):
            for t in (q, k, v):
                t.grad = None
            out = fn(q, k, v)
            out.backward(dout.to(out.dtype))
            # bf16 inputs against fp32 math: within a few bf16 roundings of the values' scale.
            torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
            for got, r in zip((q, k, v), ref, strict=True):
                torch.testing.assert_close(got.grad.float(), r.grad, atol=5e-2, rtol=5e-2)


def test_selective_checkpointing_keeps_the_fa4_output_instead_of_recomputing_it(monkeypatch):
    from kenotron.parallel.activation_checkpoint import apply_activation_checkpointing

    fake = fake_flash_attn4(dtypes=(torch.float32,))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake)
    reference, model = tiny_model(seq_len=SEQ), tiny_model(seq_len=SEQ)
    _use_fa4(model)
    apply_activation_checkpointing(list(model.layers.values()), "selective-op")
    tokens = torch.randint(0, 4096, (2, SEQ), generator=torch.Generator().manual_seed(1))
    model(tokens).float().square().mean().backward()
    reference(tokens).float().square().mean().backward()
    kinds = [call[0] for call in fake.calls]
    assert kinds.count("fwd") == 2 and kinds.count("bwd") == 2  # one forward per layer: saved, not redone
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=1e-4, msg=name)
