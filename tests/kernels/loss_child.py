"""Run by test_loss.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the loss's scale kernel against PyTorch's fp32 product. Prints "ok" last."""

from __future__ import annotations

import torch

from kenotron.kernels.loss import BLOCK, scale_to
from kenotron.train.fused_loss import (
    _chunk_loss_and_grad_for_compile,
    _triton_chunk_loss_and_grad,
)
from kenotron.train.loss import IGNORE_INDEX


def check_scale_to() -> None:
    torch.manual_seed(0)
    scale = torch.tensor(1 / 3, dtype=torch.float32)
    for n, dtype, out_dtype in [(BLOCK + 5, torch.bfloat16, torch.bfloat16), (77, torch.bfloat16, torch.float32),
                                (130, torch.float32, torch.float32), (0, torch.bfloat16, torch.bfloat16)]:
        x = torch.randn(n, dtype=torch.float32).to(dtype)
        out = scale_to(x, scale, out_dtype)
        ref = (x.float() * scale).to(out_dtype)
        assert out.dtype == out_dtype and out.shape == x.shape
        if out_dtype == torch.float32:
            assert torch.equal(out, ref), (out - ref).abs().max()
        else:
            # The interpreter narrows fp32 to bf16 by truncation (the GPU rounds to nearest even,
            # tested on CUDA): within one bf16 step of the rounded product.
            step = ref.float().abs() * 2**-7 + 1e-30
            assert ((out.float() - ref.float()).abs() <= step).all()


def check_cross_entropy() -> None:
    torch.manual_seed(0)
    # 50 < the kernel's 4096-wide block (lanes that never see a logit); 4096 + 300 spans two blocks.
    for vocab, dtype, tol in [(50, torch.float32, 1e-6), (4396, torch.float32, 1e-6), (4396, torch.bfloat16, 1e-2)]:
        h = torch.randn(37, 16).to(dtype)
        w = (torch.randn(vocab, 16) * 2).to(dtype)
        labels = torch.randint(0, vocab, (37,))
        labels[[0, 5, 36]] = IGNORE_INDEX
        labels[1] = vocab - 1  # the last logit of the row is the target
        loss, grad = _triton_chunk_loss_and_grad(h, w, labels)
        ref_loss, ref_grad = _chunk_loss_and_grad_for_compile(h, w, labels)
        assert grad.dtype == dtype and grad.shape == (37, vocab)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=tol, atol=tol)
        assert not grad[[0, 5, 36]].any()  # ignored rows have no gradient


if __name__ == "__main__":
    check_scale_to()
    check_cross_entropy()
    print("ok")
