"""Which kernel runs for each config field that offers a Triton kernel (kenotron/kernel_choice/tuning.py):
auto's pick per device, compile mode and installed triton, and the refusals naming the fix."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError
from kenotron.kernel_choice.tuning import (
    resolve_adamw_implementation,
    resolve_eager_kernels,
    resolve_expert_gate,
    resolve_grad_norm_kernel,
    resolve_loss_kernel,
)


@pytest.mark.parametrize(
    ("choice", "device", "compiled", "present", "expected"),
    [
        ("auto", "cuda", False, True, "triton"),
        ("auto", "cuda", False, False, "torch"),
        ("auto", "cuda", True, True, "torch"),
        ("auto", "cpu", False, True, "torch"),
        ("torch", "cuda", False, True, "torch"),
        ("triton", "cuda", False, True, "triton"),
    ],
)
def test_eager_kernels_auto_picks_triton_only_for_uncompiled_cuda_blocks_with_triton(choice, device, compiled,
                                                                                     present, expected):
    assert resolve_eager_kernels(choice, device, compiled, triton_present=present) == expected


@pytest.mark.parametrize(
    ("device", "compiled", "present", "message"),
    [
        ("cuda", True, True, "compile.enable=true"),
        ("cpu", False, True, "needs a CUDA device"),
        ("cuda", False, False, "needs the triton package"),
    ],
)
def test_eager_kernels_triton_where_it_cannot_run_is_refused_with_the_fix(device, compiled, present, message):
    with pytest.raises(ConfigError, match=message):
        resolve_eager_kernels("triton", device, compiled, triton_present=present)


def test_adamw_auto_picks_triton_on_cuda_with_triton_else_fused_or_foreach():
    assert resolve_adamw_implementation("auto", "cuda", triton_present=True) == "triton"
    assert resolve_adamw_implementation("auto", "cuda", triton_present=False) == "fused"
    assert resolve_adamw_implementation("auto", "cpu", triton_present=True) == "foreach"
    assert resolve_adamw_implementation("fused", "cuda", triton_present=True) == "fused"
    with pytest.raises(ConfigError, match="tuning.adamw_implementation='triton' needs a CUDA device"):
        resolve_adamw_implementation("triton", "cpu", triton_present=True)
    with pytest.raises(ConfigError, match=r"needs the triton package \(pip install triton\)"):
        resolve_adamw_implementation("triton", "cuda", triton_present=False)


def test_grad_norm_kernel_choice_and_errors_name_the_fix():
    assert resolve_grad_norm_kernel("auto", "cuda", triton_present=True) == "triton"
    assert resolve_grad_norm_kernel("auto", "cuda", triton_present=False) == "torch"
    assert resolve_grad_norm_kernel("auto", "cpu", triton_present=True) == "torch"
    with pytest.raises(ConfigError, match="tuning.grad_norm_kernel='triton' needs a CUDA device; "
                                          "use tuning.grad_norm_kernel='auto' or 'torch'"):
        resolve_grad_norm_kernel("triton", "cpu", triton_present=True)
    with pytest.raises(ConfigError, match=r"needs the triton package \(pip install triton\)"):
        resolve_grad_norm_kernel("triton", "cuda", triton_present=False)
    with pytest.raises(ConfigError, match="tuning.grad_norm_kernel='cuda' is not one of auto, triton, torch"):
        resolve_grad_norm_kernel("cuda", "cuda")


def test_loss_kernel_choice_follows_device_and_compile_and_refuses_triton_off_cuda():
    assert resolve_loss_kernel("auto", "cuda", compiled=True, triton_present=True) == "triton"
    assert resolve_loss_kernel("auto", "cuda", compiled=False, triton_present=False) == "torch"
    assert resolve_loss_kernel("auto", "cpu", compiled=True, triton_present=True) == "compiled"
    assert resolve_loss_kernel("auto", "cpu", compiled=False, triton_present=True) == "torch"
    assert resolve_loss_kernel("compiled", "cuda", compiled=False, triton_present=True) == "compiled"
    with pytest.raises(ConfigError, match="tuning.loss_kernel='triton' needs a CUDA device"):
        resolve_loss_kernel("triton", "cpu", compiled=False, triton_present=True)
    with pytest.raises(ConfigError, match="needs the triton package"):
        resolve_loss_kernel("triton", "cuda", compiled=False, triton_present=False)
    with pytest.raises(ConfigError, match="tuning.loss_kernel='fast' is not one of"):
        resolve_loss_kernel("fast", "cuda", compiled=False)


@pytest.mark.parametrize(("expert_kernel", "device", "present", "expected"), [
    ("grouped_mm", "cuda", True, "triton"),  # compiled or not
    ("grouped_mm", "cuda", False, "torch"),
    ("for_loop", "cuda", True, "torch"),  # the per-expert loop keeps its own gate (eager_kernels)
    ("for_loop", "cpu", True, "torch"),
])
def test_the_experts_triton_gate_goes_with_the_grouped_gemm_on_cuda(expert_kernel, device, present, expected):
    assert resolve_expert_gate(expert_kernel, device, present) == expected


def test_a_planned_gpu_run_of_an_moe_model_takes_the_triton_gate_and_a_cpu_run_the_pytorch_ops():
    from kenotron.config import load_config
    from kenotron.kernel_choice.target import Target
    from kenotron.train.resolve import resolve_run

    cfg = load_config(None, ["--model.name", "qwen3_moe", "--training.param_dtype", "bfloat16", "--compile.enable", "true"])
    assert resolve_run(cfg, 1, Target("cuda", 9, True, packages_here=False)).choices.expert_gate == "triton"
    assert resolve_run(cfg, 1, Target("cpu")).choices.expert_gate == "torch"

