"""Which kernel runs, for each `[tuning]` field that offers one (Triton's, torch's, a loop):
settled once, before any process group, from the device type and whether the `triton` package
is installed. Plain values in, plain values out: choices.py reads them off the config.

Every function here takes `triton_present`: None looks for the package on this machine; the
estimator passes True, planning for a GPU machine (whose torch brings triton) from one that may
lack it. A choice that cannot run is a ConfigError naming the field and the fix.
"""

from __future__ import annotations

import importlib.util

from kenotron.errors import ConfigError


def triton_importable() -> bool:
    """Whether the triton package is installed (found, not imported: importing it takes seconds)."""
    return importlib.util.find_spec("triton") is not None


def _present(triton_present: bool | None) -> bool:
    return triton_importable() if triton_present is None else triton_present


def resolve_triton_choice(field: str, choice: str, choices: tuple[str, ...], device_type: str, present: bool,
                          fallback: str) -> str:
    """The value that runs for a config `field` whose `choices` are "auto", "triton" and others:
    auto is "triton" on CUDA with the package `present`, else `fallback`; "triton" where it
    cannot run, or a value not in `choices`, is a ConfigError naming the fix."""
    if choice not in choices:
        raise ConfigError(f"{field}={choice!r} is not one of {', '.join(choices)}")
    if choice == "auto":
        return "triton" if device_type == "cuda" and present else fallback
    if choice == "triton" and (device_type != "cuda" or not present):
        missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
        others = [repr(c) for c in choices if c != "triton"]
        raise ConfigError(f"{field}='triton' needs {missing}; use {field}={', '.join(others[:-1])} or {others[-1]}")
    return choice


def resolve_eager_kernels(choice: str, device_type: str, compiled: bool, triton_present: bool | None = None) -> str:
    """"triton" or "torch" for `tuning.eager_kernels` (the fused RoPE and SwiGLU gate of
    kenotron/kernels/rope_swiglu.py, for uncompiled blocks); ConfigError when "triton" cannot run."""
    present = _present(triton_present)
    if choice not in ("auto", "triton", "torch"):
        raise ConfigError(f"tuning.eager_kernels={choice!r} is not one of auto, triton, torch")
    if choice == "torch":
        return "torch"
    if compiled:
        if choice == "triton":
            raise ConfigError(
                "tuning.eager_kernels='triton' is for uncompiled blocks, but compile.enable=true (the compiler fuses "
                "RoPE and SwiGLU itself); set tuning.eager_kernels to 'auto' or compile.enable=false"
            )
        return "torch"
    if device_type != "cuda" or not present:
        if choice == "triton":
            missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
            raise ConfigError(f"tuning.eager_kernels='triton' needs {missing}; use tuning.eager_kernels='auto' or 'torch'")
        return "torch"
    return "triton"


SSM_KERNELS = ("auto", "triton", "torch")


def resolve_ssm_kernel(choice: str, device_type: str, unsupported: str = "", triton_present: bool | None = None) -> str:
    """"triton" or "torch" for `tuning.ssm_kernel` (Mamba-2's scan: kenotron/kernels/ssd_op.py or
    the PyTorch chunked scan). `unsupported` names the model's sizes the kernels do not take
    ("" when they take them all): auto falls back to torch then, "triton" is a ConfigError."""
    resolved = resolve_triton_choice("tuning.ssm_kernel", choice, SSM_KERNELS, device_type, _present(triton_present),
                                     fallback="torch")
    if resolved == "triton" and unsupported:
        if choice == "triton":
            raise ConfigError(f"tuning.ssm_kernel='triton' does not take {unsupported} (the kernels need chunk, head "
                              f"and state sizes that are powers of two from 16, chunks up to 256); use 'auto' or 'torch'")
        return "torch"
    return resolved


LOSS_KERNELS = ("auto", "triton", "compiled", "torch")


def resolve_loss_kernel(choice: str, device_type: str, compiled: bool, triton_present: bool | None = None) -> str:
    """"triton", "compiled" or "torch" for `tuning.loss_kernel` (the fused loss's chunk step;
    the Triton one is kenotron/kernels/loss.py); ConfigError when "triton" cannot run."""
    return resolve_triton_choice("tuning.loss_kernel", choice, LOSS_KERNELS, device_type, _present(triton_present),
                                 fallback="compiled" if compiled else "torch")


GRAD_NORM_KERNELS = ("auto", "triton", "torch")


def resolve_grad_norm_kernel(choice: str, device_type: str, triton_present: bool | None = None) -> str:
    """"triton" or "torch" for `tuning.grad_norm_kernel` (the gradient norm's sum of squares,
    kenotron/kernels/sum_of_squares.py); ConfigError when "triton" cannot run."""
    return resolve_triton_choice("tuning.grad_norm_kernel", choice, GRAD_NORM_KERNELS, device_type,
                                 _present(triton_present), fallback="torch")


def resolve_adamw_implementation(implementation: str, device_type: str, triton_present: bool | None = None) -> str:
    """The AdamW kernel that runs: "triton" (one Triton kernel per tensor, kenotron/kernels/adamw.py)
    on CUDA when triton is installed (the fastest, docs/performance.md); else "fused" on CUDA and "foreach"
    on CPU, where fused is slower. A named implementation is kept (ConfigError if it cannot run)."""
    present = _present(triton_present)
    if implementation == "auto":
        if device_type != "cuda":
            return "foreach"
        return "triton" if present else "fused"
    if implementation == "triton" and (device_type != "cuda" or not present):
        missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
        raise ConfigError(f"tuning.adamw_implementation='triton' needs {missing}; use tuning.adamw_implementation='auto' "
                          f"or 'fused'")
    return implementation


def resolve_expert_kernel(choice: str, device_type: str, cuda_major: int, bf16: bool) -> str:
    """"grouped_mm" or "for_loop" for `tuning.expert_kernel`: auto picks torch._grouped_mm where its
    fast kernel runs (bf16 on a GPU of compute capability 9 or more), the per-expert loop elsewhere."""
    if choice not in ("auto", "grouped_mm", "for_loop"):
        raise ConfigError(f"tuning.expert_kernel={choice!r} is not one of auto, grouped_mm, for_loop")
    if choice == "auto":
        # cuda_major 0: a GPU not known yet (the estimator planning one): the grouped kernel's.
        return "grouped_mm" if device_type == "cuda" and (cuda_major >= 9 or cuda_major == 0) and bf16 else "for_loop"
    if choice == "grouped_mm":
        import torch  # here only: the launcher checks configs before importing torch (kernel_choice/target.py)

        if not hasattr(torch, "_grouped_mm"):
            raise ConfigError(f"tuning.expert_kernel='grouped_mm' needs torch._grouped_mm, which torch "
                              f"{torch.__version__} lacks; use 'auto' or 'for_loop'")
    return choice


def resolve_expert_gate(expert_kernel: str, device_type: str, triton_present: bool | None = None) -> str:
    """"triton" where the experts' grouped GEMM runs on CUDA with Triton: one kernel forward and one
    backward for silu(gate) * up * scale (kernels/expert_swiglu.py), in compiled blocks too, where it
    beats Inductor's fusion of the PyTorch ops (docs/performance.md, "the experts' Triton gate");
    "torch" elsewhere (the CPU, the per-expert loop)."""
    cuda = expert_kernel == "grouped_mm" and device_type == "cuda"
    return "triton" if cuda and _present(triton_present) else "torch"
