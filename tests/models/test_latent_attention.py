"""MLA's values at their own width (LatentAttention.narrow_value_attention, set where cuDNN's SDPA
or FlexAttention takes them: kernel_choice/attention_backend.py): the same logits and gradients
as the values zero-padded to the keys' width, on the CPU (SDPA's math kernel, with and without a
document mask) and, on a GPU, through cuDNN and compiled FlexAttention; an attention_fn that
replaced SDPA's (context parallel's, flash-attn's) still gets them padded."""

from __future__ import annotations

import pytest
import torch

from kenotron.kernel_choice.attention_backend import cudnn_takes, model_latent_attentions, use_narrow_values
from kenotron.models import get_model_spec

SPEC = get_model_spec("deepseek_v3")


def _model(device: str, dtype: torch.dtype):
    args = SPEC.model_args("debug", max_seq_len=64, mtp_depth=0)
    with torch.device("meta"):
        model = SPEC.build(args)
    model.to_empty(device=device)
    model.init_weights(seed=0)
    tokens = torch.randint(0, args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
    return model.to(dtype), tokens


def _logits_and_grads(model, tokens) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    logits.float().pow(2).mean().backward()
    return logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def _padded_against_narrow(model, tokens):
    attentions = model_latent_attentions(model)
    assert attentions and all(m.shape.v_dim < m.shape.qk_dim for m in attentions)  # the debug model's heads differ
    padded = _logits_and_grads(model, tokens)
    use_narrow_values(model, True)
    assert all(m.narrow_value_attention is not None for m in attentions)
    return padded, _logits_and_grads(model, tokens)


def test_unpadded_values_give_the_padded_values_logits_and_gradients_on_cpu():
    model, tokens = _model("cpu", torch.float32)
    (logits, grads), (narrow_logits, narrow_grads) = _padded_against_narrow(model, tokens)
    torch.testing.assert_close(narrow_logits, logits, rtol=1e-5, atol=1e-5)
    assert narrow_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(narrow_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_replaced_attention_fn_still_gets_the_values_padded_to_the_keys_width():
    model, tokens = _model("cpu", torch.float32)
    use_narrow_values(model, True)
    widths: list[tuple[int, int]] = []

    def recording(q, k, v, *extra):
        widths.append((q.shape[-1], v.shape[-1]))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    for module in model_latent_attentions(model):
        module.attention_fn = recording
    model(tokens)
    qk = model_latent_attentions(model)[0].shape.qk_dim
    assert widths and set(widths) == {(qk, qk)}


def test_narrow_values_are_off_unless_chosen():
    model, _ = _model("cpu", torch.float32)
    use_narrow_values(model, False)
    assert all(m.narrow_value_attention is None for m in model_latent_attentions(model))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's attention needs a CUDA GPU")
def test_cudnn_takes_the_unpadded_values_and_matches_the_padded_path_on_the_gpu():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("measured on Hopper and later")
    assert cudnn_takes(192, 128, 4096, torch.bfloat16)  # DeepSeek-V3's heads
    assert not cudnn_takes(192, 128, 4096, torch.float32)  # cuDNN's attention runs 16-bit only
    model, tokens = _model("cuda", torch.bfloat16)
    (logits, grads), (narrow_logits, narrow_grads) = _padded_against_narrow(model, tokens)
    torch.testing.assert_close(narrow_logits, logits, rtol=2e-2, atol=2e-2)
    for name, grad in grads.items():
        scale = grad.abs().max().clamp_min(1e-6)
        assert (narrow_grads[name] - grad).abs().max() <= 0.05 * scale, name


def test_unpadded_values_under_a_document_mask_give_the_padded_values_results_on_cpu():
    """The FlexAttention path (a BlockMask: document masking), as the CPU runs it in training
    (SDPA with the mask made dense)."""
    from kenotron.models.common.flex_attention import document_block_mask

    model, tokens = _model("cpu", torch.float32)
    documents = (torch.arange(tokens.shape[1]) >= 40).long().expand(tokens.shape[0], -1)  # two documents a row
    mask = document_block_mask(documents)
    attentions = model_latent_attentions(model)

    def run():
        model.zero_grad(set_to_none=True)
        logits = model(tokens, block_mask=mask)
        logits.pow(2).mean().backward()
        return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    logits, grads = run()
    use_narrow_values(model, True)
    assert all(m.narrow_value_attention is not None for m in attentions)
    narrow_logits, narrow_grads = run()
    torch.testing.assert_close(narrow_logits, logits, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(narrow_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's kernel needs a CUDA GPU here")
def test_flex_attention_takes_the_unpadded_values_and_matches_the_padded_path_on_the_gpu():
    from kenotron.models.common.flex_attention import document_block_mask

    model, tokens = _model("cuda", torch.bfloat16)
    documents = (torch.arange(tokens.shape[1], device="cuda") >= 40).long().expand(tokens.shape[0], -1)
    mask = document_block_mask(documents)
    padded = model(tokens, block_mask=mask).detach().float()
    use_narrow_values(model, True)
    narrow = model(tokens, block_mask=mask).detach().float()
    torch.testing.assert_close(narrow, padded, rtol=2e-2, atol=2e-2)
