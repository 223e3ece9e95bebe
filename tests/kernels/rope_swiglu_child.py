"""Run by test_rope_swiglu.py in a child process with TRITON_INTERPRET=1 (Triton's CPU
interpreter): the fused kernels against the PyTorch ops they replace. Exits non-zero on a mismatch."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kenotron.kernels.rope_swiglu import triton_rope, triton_silu_mul
from kenotron.models.common.attention import GQAttention
from kenotron.models.common.mlp import SwiGLU
from kenotron.models.common.rope import apply_rope, rope_cos_sin
from tests.models.tiny import tiny_model


def check_rope() -> None:
    for head_dim, heads in [(64, 4), (80, 3)]:  # 80: half of head_dim is not a power of two
        cos, sin = rope_cos_sin(head_dim, 16, 10000.0, None)
        x = torch.randn(2, 16, heads * head_dim, dtype=torch.float64).view(2, 16, heads, head_dim).requires_grad_()
        grad = torch.randn(2, heads, 16, head_dim, dtype=torch.float64).transpose(1, 2)  # SDPA's layout
        ref = apply_rope(x, cos.double(), sin.double())
        (ref_grad,) = torch.autograd.grad(ref, x, grad)
        out = triton_rope(x, cos, sin)
        (out_grad,) = torch.autograd.grad(out, x, grad)
        # The kernel computes in fp32 from fp32 tables: compare at fp32 precision.
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out_grad, ref_grad, rtol=1e-5, atol=1e-5)
        assert out.is_contiguous()


def check_silu_mul() -> None:
    a = torch.randn(3, 1000, dtype=torch.float64, requires_grad=True)  # 3000: not a multiple of the block
    b = torch.randn(3, 1000, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 1000, dtype=torch.float64)
    ref = F.silu(a) * b
    ref_grads = torch.autograd.grad(ref, (a, b), grad)
    out = triton_silu_mul(a, b)
    out_grads = torch.autograd.grad(out, (a, b), grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for o, r in zip(out_grads, ref_grads):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def check_model() -> None:
    """A debug Llama with both kernels installed: same loss and gradients as with PyTorch's ops."""
    models = [tiny_model(seq_len=32, seed=3) for _ in range(2)]
    for module in models[1].modules():
        if isinstance(module, GQAttention):
            module.rope_fn = triton_rope
        elif isinstance(module, SwiGLU):
            module.silu_mul = triton_silu_mul
    tokens = torch.randint(0, models[0].args.vocab_size, (2, 32))
    losses, grads = [], []
    for model in models:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


if __name__ == "__main__":
    torch.manual_seed(0)
    check_rope()
    check_silu_mul()
    check_model()
    print("ok")
    sys.exit(0)
