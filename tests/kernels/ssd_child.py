"""Run by test_ssd.py in a child process with TRITON_INTERPRET=1 (Triton's CPU interpreter): the
Triton SSD scan against the PyTorch chunked scan, values and every gradient, on strided inputs
like the mixer's; the mixer's Triton op (convolution, scan, gated norm) against the mixer's
PyTorch path; then a whole Mamba-2 model with the op installed. Exits non-zero on a mismatch."""

from __future__ import annotations

import dataclasses
import sys

import torch

from kenotron.kernels.ssd_op import ssd_scan
from kenotron.models import get_model_spec
from kenotron.models.common.mamba import Mamba2Mixer, MixerShape, use_scan_kernel
from kenotron.models.common.ssd import ssd_chunked


def inputs(length: int, heads=4, head_dim=16, groups=2, state=32, seed=0):
    """x, B, C as slices of one (b, l, channels) buffer and dt of another, as the mixer hands them."""
    g = torch.Generator().manual_seed(seed)
    b = 2
    xbc = torch.randn(b, length, heads * head_dim + 2 * groups * state + 3, generator=g)
    xbc[..., heads * head_dim:] /= 4
    proj = torch.randn(b, length, heads + 5, generator=g) - 1
    leaves = [xbc.requires_grad_(), proj.requires_grad_(), (-torch.rand(heads, generator=g) * 3 - 0.5).requires_grad_(),
              torch.randn(heads, generator=g).requires_grad_(), (torch.randn(heads, generator=g) / 2).requires_grad_()]

    def views(xbc, proj, A, D, bias):
        x = xbc[..., : heads * head_dim].unflatten(-1, (heads, head_dim))
        B = xbc[..., heads * head_dim: heads * head_dim + groups * state].unflatten(-1, (groups, state))
        C = xbc[..., heads * head_dim + groups * state: -3].unflatten(-1, (groups, state))
        return x, proj[..., 2: 2 + heads], A, B, C, D, bias

    return leaves, views


def check_scan(length: int, chunk: int) -> None:
    leaves, views = inputs(length)
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    y = ssd_scan(*views(*leaves), chunk)
    ref = ssd_chunked(*views(*ref_leaves), chunk)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))  # seeded: the tolerances hold for these draws
    grads = torch.autograd.grad(y, leaves, dy)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dy)
    for name, got, want in zip(["xBC", "dt", "A", "D", "dt_bias"], grads, ref_grads):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5 * max(scale, 1.0), msg=lambda m, n=name: f"{n}: {m}")


def check_mixer(groups: int, conv_bias: bool, length: int, compiled: bool = False) -> None:
    """One mixer, its input and every parameter's gradient: the Triton op against the PyTorch path."""
    shape = MixerShape(dim=32, heads=4, head_dim=16, groups=groups, state=16, conv_kernel=4, chunk_size=16)
    mixers = []
    for _ in range(2):
        torch.manual_seed(0)
        mixer = Mamba2Mixer(shape, norm_eps=1e-5, conv_bias=conv_bias, proj_bias=False, a_init=(1.0, 16.0),
                            dt_init=(0.001, 0.1, 1e-4), out_std_divisor=1.0)
        for p in mixer.parameters():
            torch.nn.init.uniform_(p, -0.5, 0.5) if p.dim() > 1 else torch.nn.init.uniform_(p, 0.5, 1.5)
        mixers.append(mixer)
    plain, fast = mixers
    use_scan_kernel(fast, "triton")
    x = torch.randn(2, length, 32, generator=torch.Generator().manual_seed(1))
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    # Compiled, Inductor checks that the op's outputs (its gradients too) have the fake's strides.
    a, b = plain(xs[0]), (torch.compile(fast, fullgraph=True) if compiled else fast)(xs[1])
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    dy = torch.randn(a.shape, generator=torch.Generator().manual_seed(2))
    a.backward(dy)
    b.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-4, atol=2e-5 * max(xs[0].grad.abs().max().item(), 1.0))
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        scale = max(p.grad.abs().max().item(), 1.0)
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=2e-5 * scale, msg=lambda m, n=name: f"{n}: {m}")


def check_model() -> None:
    spec = get_model_spec("mamba2")
    # The debug flavor at a quarter of its width (4 heads of 32 in 4 groups, chunks of 32), one
    # block and a small vocabulary: the interpreter's cost grows with the kernels' grids and the
    # blocks, not with what is checked here (the op installed in a model, gradients through it to
    # the embedding); the kernels' own cases are the checks above. 2 blocks at width 128: 4x slower.
    args = dataclasses.replace(spec.model_args("debug", max_seq_len=80), n_layers=1, dim=64, vocab_size=256)
    with torch.device("meta"):
        plain, fast = spec.build(args), spec.build(args)
    for model in (plain, fast):
        model.to_empty(device="cpu")
        model.init_weights(seed=0)
    use_scan_kernel(fast, "triton")
    assert fast.layers["0"].mixer.triton_op and not plain.layers["0"].mixer.triton_op
    tokens = torch.randint(0, 256, (1, 80), generator=torch.Generator().manual_seed(0))  # 2 chunks and a part
    a, b = plain(tokens), fast(tokens)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    a.float().square().mean().backward()
    b.float().square().mean().backward()
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


if __name__ == "__main__":
    check_scan(40, 16)  # 3 chunks, the last partial, one block each
    check_scan(200, 128)  # 2 chunks of 2 x 2 blocks, the last partial
    check_mixer(groups=1, conv_bias=False, length=45)  # 3 chunks and a part; 2 convolution tiles, the last partial
    check_mixer(groups=2, conv_bias=True, length=20, compiled=True)
    check_model()
    print("ok")
    sys.exit(0)
