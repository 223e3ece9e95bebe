"""Run by test_fused_loss.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the loss's scale kernel against PyTorch's fp32 product. Prints "ok" last."""

from __future__ import annotations

import torch

from kenotron.train.loss_kernels import BLOCK, scale_to


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


if __name__ == "__main__":
    check_scale_to()
    print("ok")
