"""The MoE experts' grouped GEMM path (torch._grouped_mm, bf16, Hopper) against the per-expert loop
on a GPU: the same layer outputs and gradients within bf16 tolerance. Skips without CUDA."""

from __future__ import annotations

import pytest
import torch

from kenotron.models.common.moe import MoE
from kenotron.models.common.moe_args import MoEArgs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _run(layer: MoE, x: torch.Tensor, grad: torch.Tensor, kernel: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    layer.experts.kernel = kernel
    layer.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    out = layer(xx)
    out.backward(grad)
    grads = {n: p.grad.float().clone() for n, p in layer.named_parameters()}
    grads["input"] = xx.grad.float().clone()
    return out.float(), grads


def _bf16_layer_and_batch() -> tuple[MoE, torch.Tensor, torch.Tensor]:
    """A seeded bf16 MoE layer (64 experts, top-8) on the GPU, 4096 tokens and an output gradient."""
    torch.manual_seed(0)
    layer = MoE(512, MoEArgs(n_experts=64, top_k=8, ffn_dim=256)).cuda()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.05)
    layer = layer.bfloat16()
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    return layer, x, grad


def test_grouped_mm_equals_the_per_expert_loop_in_bf16():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch._grouped_mm's bf16 kernel needs compute capability 9+")
    layer, x, grad = _bf16_layer_and_batch()
    out_g, grads_g = _run(layer, x, grad, "grouped_mm")
    out_l, grads_l = _run(layer, x, grad, "for_loop")
    scale = out_l.abs().max()
    assert (out_g - out_l).abs().max() <= 2e-2 * scale
    for name in grads_l:
        ref = grads_l[name]
        assert (grads_g[name] - ref).abs().max() <= 3e-2 * ref.abs().max(), name


def test_float8_experts_follow_the_bf16_grouped_gemm():
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the float8 grouped GEMM needs compute capability 9+")
    from kenotron.parallel.float8 import convert_experts_to_float8

    layer, x, grad = _bf16_layer_and_batch()
    out_b, grads_b = _run(layer, x, grad, "grouped_mm")
    convert_experts_to_float8(layer)
    out_f, grads_f = _run(layer, x, grad, "grouped_mm")
    # Rowwise float8 (e4m3, 3 mantissa bits): a few percent of relative error, not bf16's 1%.
    assert (out_f - out_b).norm() <= 0.1 * out_b.norm()
    for name in grads_b:
        assert (grads_f[name] - grads_b[name]).norm() <= 0.1 * grads_b[name].norm(), name


def test_the_triton_gate_equals_the_pytorch_gate_in_compiled_blocks():
    """Choices.expert_gate = "triton" (the default on CUDA with Triton): the experts' gate is
    kernels/expert_swiglu.py's, up to the last group's end, also where the layer is compiled."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch._grouped_mm's bf16 kernel needs compute capability 9+")
    layer, x, grad = _bf16_layer_and_batch()
    layer.forward = torch.compile(layer.forward)
    layer.experts.gate = "torch"
    out_t, grads_t = _run(layer, x, grad, "grouped_mm")
    torch._dynamo.reset()
    layer.experts.gate = "triton"
    out_g, grads_g = _run(layer, x, grad, "grouped_mm")
    assert (out_g - out_t).abs().max() <= 2e-2 * out_t.abs().max()
    for name in grads_t:
        ref = grads_t[name]
        assert (grads_g[name] - ref).abs().max() <= 3e-2 * ref.abs().max(), name
