"""FlexAttention: causal and block-causal (document) masks against SDPA, and in the model.

On CPU torch's flex_attention runs forward only (its backward is refused: "FlexAttention does
not support backward on CPU"), so kenotron computes CPU gradients through SDPA with the block
mask made dense (flex_attention.py). The tests check both: flex_attention itself in forward,
kenotron's CPU training path in forward and backward, and, with torch's device guard lifted
for the test only, flex_attention's own (eager, reference) backward, which is what tells
whether the mask and the grouped-query call given to flex are right.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
import torch.nn.functional as F

from kenotron.data.packing import document_ids
from kenotron.models.common.flex_attention import (
    causal_block_mask,
    dense_mask,
    document_block_mask,
    flex_attend,
)
from tests.models.tiny import tiny_model

# Eager flex_attention on CPU warns that it is the unfused reference: that is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, HQ, HKV, S, D = 2, 4, 2, 40, 16  # grouped-query heads; 40 is not a multiple of flex's 128-token block


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    """Lift torch's refusal of flex_attention's backward on CPU (the eager reference has one)."""
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None, raising=False)


def qkv(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, HQ, S, D), (B, HKV, S, D), (B, HKV, S, D)]
    return [torch.randn(shape, generator=g, requires_grad=True) for shape in shapes]


def grads(out: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return torch.autograd.grad(out, inputs, torch.randn(out.shape, generator=g))


def assert_all_close(got, want, tol: float = 2e-6) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def random_document_ids(seed: int = 0) -> torch.Tensor:
    """(B, S) document ids: each row cut at its own random EOS positions (one row has none)."""
    g = torch.Generator().manual_seed(seed)
    eos = 0
    tokens = torch.randint(1, 50, (B, S), generator=g)
    tokens[0, torch.randperm(S, generator=g)[:5]] = eos
    return document_ids(tokens, eos)


def explicit_block_causal_mask(doc: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, 1, S, S) boolean mask written out element by element, independently of the library."""
    mask = torch.zeros(B, 1, S, S, dtype=torch.bool)
    for b in range(B):
        for i in range(S):
            for j in range(S):
                in_window = window is None or i - j < window
                mask[b, 0, i, j] = j <= i and in_window and bool(doc[b, i] == doc[b, j])
    return mask


def test_flex_causal_equals_sdpa_causal_forward_and_gradients(flex_backward_on_cpu):
    q, k, v = qkv()
    mask = causal_block_mask(S, "cpu")
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with torch.no_grad():  # flex_attention itself (forward only on CPU)
        torch.testing.assert_close(flex_attend(q, k, v, mask), reference, atol=1e-6, rtol=1e-6)
    want = grads(reference, [q, k, v])
    out = flex_attend(q, k, v, mask)  # kenotron's CPU training path
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-6)
    assert_all_close(grads(out, [q, k, v]), want)
    out = torch_flex.flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    assert_all_close(grads(out, [q, k, v]), want)


@pytest.mark.parametrize("window", [None, 6])
def test_block_causal_flex_equals_sdpa_with_an_explicit_mask(window, flex_backward_on_cpu):
    q, k, v = qkv(seed=2)
    doc = random_document_ids()
    assert doc[0].max() >= 3 and doc[1].max() == 0  # several documents in one row, one in the other
    explicit = explicit_block_causal_mask(doc, window)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=explicit, enable_gqa=True)
    mask = document_block_mask(doc, window)
    assert torch.equal(dense_mask(mask), explicit)
    with torch.no_grad():
        torch.testing.assert_close(flex_attend(q, k, v, mask), reference, atol=1e-6, rtol=1e-6)
    want = grads(reference, [q, k, v])
    out = flex_attend(q, k, v, mask)
    assert_all_close(grads(out, [q, k, v]), want)
    out = torch_flex.flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-6)
    assert_all_close(grads(out, [q, k, v]), want)


@pytest.mark.parametrize("grad", [False, True], ids=["flex-forward", "cpu-training-path"])
def test_second_document_of_a_packed_window_gives_the_logits_it_gives_alone(grad):
    bos, eos = 1, 2
    g = torch.Generator().manual_seed(0)
    first = torch.cat([torch.tensor([bos]), torch.randint(3, 4096, (10,), generator=g), torch.tensor([eos])])
    second = torch.cat([torch.tensor([bos]), torch.randint(3, 4096, (18,), generator=g), torch.tensor([eos])])
    window = torch.cat([first, second])[None]  # (1, 32): two whole documents
    model = tiny_model()
    assert model.args.n_kv_heads < model.args.n_heads  # grouped-query attention
    with torch.set_grad_enabled(grad):
        packed = model(window, block_mask=document_block_mask(document_ids(window, eos)))
        alone = model(second[None])
        unmasked = model(window)
    n = len(first)
    # RoPE makes scores depend on relative positions only, so the offset of the second
    # document (positions 12.. instead of 0..) changes its logits by rounding alone.
    torch.testing.assert_close(packed[:, n:], alone, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(packed[:, :n], unmasked[:, :n], atol=1e-5, rtol=1e-5)  # the first is causal anyway
    assert (unmasked[:, n:] - alone).abs().max() > 1e-2  # without the mask the second one sees the first


def test_block_mask_with_the_models_window_equals_its_dense_window_mask():
    # Mistral's debug window is 128 tokens: at 160 the model builds a dense windowed mask;
    # a causal block mask with the same window must give the same logits.
    model = tiny_model("mistral", seq_len=160)
    assert model.sliding_window == 128
    tokens = torch.randint(0, 4096, (1, 160), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = model(tokens)
        flex = model(tokens, block_mask=causal_block_mask(160, "cpu", model.sliding_window))
        full_causal = model(tokens, block_mask=causal_block_mask(160, "cpu"))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    assert (full_causal[:, 128:] - dense[:, 128:]).abs().max() > 1e-3  # the window really acts


def test_block_mask_is_refused_with_generation_inputs_or_a_replaced_attention_fn():
    model = tiny_model()
    tokens = torch.randint(0, 4096, (1, 8))
    mask = causal_block_mask(8, "cpu")
    with pytest.raises(ValueError, match="block_mask is for training"):
        model(tokens, token_mask=torch.ones(1, 8, dtype=torch.bool), block_mask=mask)

    class ShardedAttention:  # what context parallel installs: sees a shard of the sequence
        def __call__(self, q, k, v):
            raise AssertionError("not called")

    model.layers["0"].attention.attention_fn = ShardedAttention()
    with pytest.raises(RuntimeError, match="replaced by ShardedAttention"):
        model(tokens, block_mask=mask)
