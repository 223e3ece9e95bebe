"""kenotron's Triton SSD scan (kenotron/kernels/ssd*.py) equals the PyTorch chunked scan in value
and gradient: on the CPU through Triton's interpreter (a child process: TRITON_INTERPRET must be
set before triton is imported), and on a GPU in bf16 within bf16's rounding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kenotron.kernel_choice.tuning import resolve_ssm_kernel
from kenotron.kernels.ssd_op import supports
from kenotron.models.common.ssd import ssd_chunked
from tests.triton_interpreter import interpreter_job

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")


@needs_triton
@pytest.mark.run_ahead(job=interpreter_job(Path(__file__).with_name("ssd_child.py")))
def test_scan_and_a_model_match_the_pytorch_scan_in_value_and_every_gradient(ran_ahead):
    assert ran_ahead.strip().endswith("ok")  # the script's checks passed (tests/triton_interpreter.py)


def test_kernel_choice_falls_back_where_the_kernels_cannot_run():
    assert supports(256, 64, 128) and supports(32, 32, 32)
    assert not supports(256, 48, 128) and not supports(512, 64, 128)
    assert resolve_ssm_kernel("auto", "cuda", "", triton_present=True) == "triton"
    assert resolve_ssm_kernel("auto", "cpu", "", triton_present=True) == "torch"
    assert resolve_ssm_kernel("auto", "cuda", "ssm_head_dim=48", triton_present=True) == "torch"
    with pytest.raises(Exception, match="tuning.ssm_kernel='triton' does not take ssm_head_dim=48"):
        resolve_ssm_kernel("triton", "cuda", "ssm_head_dim=48", triton_present=True)
    with pytest.raises(Exception, match="tuning.ssm_kernel='triton' needs a CUDA device"):
        resolve_ssm_kernel("triton", "cpu", "")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_on_cuda_stays_within_bf16_rounding_of_the_fp32_pytorch_scan():
    from kenotron.kernels.ssd_op import ssd_scan

    torch.manual_seed(0)
    dev = torch.device("cuda")
    b, length, heads, p, g, n = 2, 1000, 16, 64, 2, 128
    ins = [torch.randn(b, length, heads, p), torch.randn(b, length, heads) - 1, -torch.rand(heads) * 3 - 0.5,
           torch.randn(b, length, g, n) / 8, torch.randn(b, length, g, n) / 8, torch.randn(heads),
           torch.randn(heads) / 2]
    ins = [t.to(dev) for t in ins]
    low = [t.bfloat16() if t.dim() > 1 else t for t in ins]
    low = [t.detach().requires_grad_() for t in low]
    ref = [t.detach().float().requires_grad_() for t in low]
    y = ssd_scan(*low, 256)
    y_ref = ssd_chunked(*ref, 256)
    dy = torch.randn_like(y_ref)
    grads = torch.autograd.grad(y, low, dy.bfloat16())
    ref_grads = torch.autograd.grad(y_ref, ref, dy)
    # bf16 inputs, reference computed in fp32 from the same bf16 values: what is left is the
    # kernels' own bf16 rounding of the products' operands. dA and the bias gradient sum
    # position terms that largely cancel, hence their looser bound.
    bounds = {"y": 1e-2, "x": 2e-2, "dt": 3e-2, "A": 5e-2, "B": 2e-2, "C": 2e-2, "D": 2e-2, "dt_bias": 5e-2}
    errors = {"y": ((y.float() - y_ref).abs().max() / y_ref.abs().max()).item()}
    for name, got, want in zip(["x", "dt", "A", "B", "C", "D", "dt_bias"], grads, ref_grads):
        errors[name] = ((got.float() - want).abs().max() / want.abs().max()).item()
    print(errors)
    assert all(errors[k] <= bounds[k] for k in bounds), errors


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixer_op_in_bf16_on_cuda_stays_within_bf16_rounding_of_the_fp32_pytorch_mixer():
    import copy

    from kenotron.models.common.mamba import Mamba2Mixer, MixerShape, use_scan_kernel

    torch.manual_seed(0)
    shape = MixerShape(dim=256, heads=8, head_dim=64, groups=2, state=128, conv_kernel=4, chunk_size=256)
    ref = Mamba2Mixer(shape, norm_eps=1e-5, conv_bias=True, proj_bias=False, a_init=(1.0, 16.0),
                      dt_init=(0.001, 0.1, 1e-4), out_std_divisor=1.0).cuda()
    for p in ref.parameters():
        torch.nn.init.uniform_(p, -0.3, 0.3) if p.dim() > 1 else torch.nn.init.uniform_(p, 0.5, 1.5)
    fast = copy.deepcopy(ref).bfloat16()
    ref = copy.deepcopy(fast).float()  # the same bf16-rounded weights: what differs is the arithmetic
    use_scan_kernel(fast, "triton")
    x = torch.randn(2, 700, 256, device="cuda").bfloat16().float()
    x_ref, x_fast = x.clone().requires_grad_(), x.bfloat16().requires_grad_()
    y_ref, y_fast = ref(x_ref), fast(x_fast)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y_fast.backward(dy.bfloat16())

    def rel(got, want):
        return ((got.float() - want).abs().max() / want.abs().max()).item()

    errors = {"y": rel(y_fast, y_ref), "dx": rel(x_fast.grad, x_ref.grad)}
    errors.update({name: rel(q.grad, p.grad) for (name, p), q in zip(ref.named_parameters(), fast.parameters())})
    print(errors)
    assert max(errors.values()) < 3e-2, errors
