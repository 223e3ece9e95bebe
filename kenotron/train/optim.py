"""AdamW with decoupled weight decay and the fastest kernel the device has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kenotron.config import ConfigError
from kenotron.config import Optimizer as OptimizerConfig
from kenotron.train.eager_kernels import resolve_triton_choice, triton_importable


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """What an optimizer's `step(closure)` returns: the closure's loss, evaluated with grad enabled
    (steps run under no_grad), or None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices and embeddings decay; vectors (norm scales, biases) do not."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def resolve_adamw_implementation(implementation: str, device_type: str, triton_present: bool | None = None) -> str:
    """The AdamW kernel that runs: "triton" (one Triton kernel per tensor, kenotron/train/triton_adamw.py)
    on CUDA when triton is installed, measured fastest on H200; else "fused" on CUDA and "foreach"
    on CPU, where fused is slower. A named implementation is kept (ConfigError if it cannot run)."""
    present = triton_importable() if triton_present is None else triton_present
    if implementation == "auto":
        if device_type != "cuda":
            return "foreach"
        return "triton" if present else "fused"
    if implementation == "triton" and (device_type != "cuda" or not present):
        missing = "a CUDA device" if device_type != "cuda" else "the triton package (pip install triton)"
        raise ConfigError(f"optimizer.implementation='triton' needs {missing}; use optimizer.implementation='auto' "
                          f"or 'fused'")
    return implementation


GRAD_NORM_KERNELS = ("auto", "triton", "torch")


def resolve_grad_norm_kernel(choice: str, device_type: str, triton_present: bool | None = None) -> str:
    """"triton" or "torch" for `training.grad_norm_kernel` (the gradient norm's sum of squares,
    kenotron/parallel/sum_of_squares.py); ConfigError when "triton" cannot run."""
    present = triton_importable() if triton_present is None else triton_present
    return resolve_triton_choice("training.grad_norm_kernel", choice, GRAD_NORM_KERNELS, device_type, present,
                                 fallback="torch")


def adamw_kernel_kwargs(implementation: str) -> dict[str, bool]:
    """torch.optim.AdamW's flags for one of its own implementations."""
    return {
        "fused": {"fused": True, "foreach": False},
        "foreach": {"fused": False, "foreach": True},
        "for-loop": {"fused": False, "foreach": False},
    }[implementation]


def optimizer_factory(cfg: OptimizerConfig, device_type: str, triton_present: bool | None = None,
                      master_weights: bool = False) -> Callable[[list[dict]], torch.optim.Optimizer]:
    """A function from parameter groups to the configured optimizer (`triton_present`: None looks
    for the package, see resolve_adamw_implementation). `master_weights`: AdamW keeps fp32 masters
    and turns the parameters bf16 when built (kenotron/train/master_weights.py)."""
    if master_weights and cfg.name != "adamw":
        raise ConfigError(f"training.mixed_precision='master_weights' keeps its fp32 masters in AdamW's state, but "
                          f"optimizer.name={cfg.name!r}; use optimizer.name='adamw' or another mixed_precision")
    if cfg.name == "sgd":
        return lambda groups: torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.name != "adamw":
        raise ValueError(f"optimizer.name={cfg.name!r} is not supported; use 'adamw' or 'sgd'")
    implementation = resolve_adamw_implementation(cfg.implementation, device_type, triton_present)
    betas = (cfg.beta1, cfg.beta2)
    if master_weights:
        from kenotron.train.master_weights import MasterWeightAdamW

        return lambda groups: MasterWeightAdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, kernel=implementation)
    if implementation == "triton":
        # Importing it imports triton: only when chosen.
        from kenotron.train.triton_adamw import TritonAdamW

        return lambda groups: TritonAdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
    kernel = adamw_kernel_kwargs(implementation)
    return lambda groups: torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, **kernel)


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, device_type: str) -> torch.optim.Optimizer:
    return optimizer_factory(cfg, device_type)(param_groups(model, cfg.weight_decay))
