"""AdamW with decoupled weight decay and the fastest kernel the device has."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from kenotron.config import Optimizer as OptimizerConfig


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


def adamw_kernel_kwargs(implementation: str, device_type: str) -> dict[str, bool]:
    """`fused=True` on GPUs (one kernel for all parameters); foreach on CPU where fused is slower."""
    if implementation == "auto":
        implementation = "fused" if device_type == "cuda" else "foreach"
    return {
        "fused": {"fused": True, "foreach": False},
        "foreach": {"fused": False, "foreach": True},
        "for-loop": {"fused": False, "foreach": False},
    }[implementation]


def optimizer_factory(cfg: OptimizerConfig, device_type: str) -> Callable[[list[dict]], torch.optim.Optimizer]:
    """A function from parameter groups to the configured optimizer."""
    if cfg.name == "sgd":
        return lambda groups: torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.name != "adamw":
        raise ValueError(f"optimizer.name={cfg.name!r} is not supported; use 'adamw' or 'sgd'")
    kernel = adamw_kernel_kwargs(cfg.implementation, device_type)
    return lambda groups: torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kernel)


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, device_type: str) -> torch.optim.Optimizer:
    return optimizer_factory(cfg, device_type)(param_groups(model, cfg.weight_decay))
