"""The optimizer builder: AdamW with decoupled weight decay and the fastest kernel the device has,
Muon (train/muon.py) or SGD, and their parameter groups."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import torch
from torch import nn

from kenotron.config import ConfigError
from kenotron.config import Optimizer as OptimizerConfig
from kenotron.models.common.parametrization import spectral_lr_scales
from kenotron.train.closure import closure_loss
from kenotron.train.master_weights import MasterWeightAdamW
from kenotron.train.muon import Muon
from kenotron.train.muon_groups import muon_param_groups


class TritonAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (same hyper-parameters and state) with the update in one Triton kernel
    per tensor (kenotron/kernels/adamw.py)."""

    # The trainer's clipping hands the divisor over as `grad_scale` when the optimizer divides
    # inside its kernel (kenotron.parallel.grad_norm.optimizer_unscales_gradients).
    _step_supports_amp_scaling = True
    divides_by_grad_scale = True

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float = 0.01) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False, fused=False)
        self.grad_scale: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure=None):
        from kenotron.kernels.adamw import adamw_step_group  # imports triton: only when this optimizer runs

        loss = closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                adamw_step_group(group, params, [self._state(p) for p in params], self.grad_scale)
        return loss

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            # torch's AdamW layout: a CPU step counter (no device sync to read it) and moments like p.
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if state["step"].device.type != "cpu":  # loaded from torch's fused AdamW: read it once
            state["step"] = state["step"].cpu()
        return state


def param_groups(model: nn.Module, weight_decay: float, lr: float,
                 lr_scales: Mapping[str, float] | None = None) -> list[dict]:
    """Matrices and embeddings decay; vectors (norm scales, biases) do not. A parameter named in
    `lr_scales` trains at lr times its scale (spectral µP's per-matrix rates), the rest at lr;
    one group per (decay, scale), in the order the parameters come."""
    lr_scales = lr_scales or {}
    groups: dict[tuple[bool, float], dict] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decay, scale = p.ndim >= 2, lr_scales.get(name, 1.0)
        group = groups.setdefault((decay, scale), {"params": [], "weight_decay": weight_decay if decay else 0.0,
                                                   "lr": lr * scale})
        group["params"].append(p)
    return list(groups.values())


def build_param_groups(model: nn.Module, cfg: OptimizerConfig, parametrization: str) -> list[dict]:
    """The configured optimizer's groups for `model`: Muon's split (train/muon_groups.py) for
    optimizer.name='muon', else `param_groups` (with spectral µP's AdamW rates when asked)."""
    if cfg.name == "muon":
        return muon_param_groups(model, cfg, parametrization)
    scales = spectral_lr_scales(model) if parametrization == "spectral_mup" else None
    return param_groups(model, cfg.weight_decay, cfg.lr, scales)


def adamw_kernel_kwargs(implementation: str) -> dict[str, bool]:
    """torch.optim.AdamW's flags for one of its own implementations."""
    return {
        "fused": {"fused": True, "foreach": False},
        "foreach": {"fused": False, "foreach": True},
        "for-loop": {"fused": False, "foreach": False},
    }[implementation]


def optimizer_factory(cfg: OptimizerConfig, implementation: str, master_weights: bool = False,
                      device_type: str = "cpu", muon_tuning: tuple[str, str] = ("owner", "auto"),
                      masters_for: Collection[torch.Tensor] | None = None,
                      ) -> Callable[[list[dict]], torch.optim.Optimizer]:
    """A function from parameter groups to the configured optimizer. `implementation`: AdamW's
    kernel as resolve_run chose it (Choices.adamw). `master_weights`: AdamW keeps fp32 masters
    and turns the parameters bf16 when built (kenotron/train/master_weights.py); those in
    `masters_for` only, when given (the others stay fp32). `device_type`
    and `muon_tuning` (tuning.muon_redistribution, tuning.muon_compile) set how Muon's
    Newton–Schulz runs: bf16 and compiled on CUDA, fp32 eager elsewhere."""
    if master_weights and cfg.name != "adamw":
        raise ConfigError(f"tuning.mixed_precision='master_weights' keeps its fp32 masters in AdamW's state, but "
                          f"optimizer.name={cfg.name!r}; use optimizer.name='adamw' or another mixed_precision")
    if cfg.name == "sgd":
        return lambda groups: torch.optim.SGD(groups, lr=cfg.lr)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.name == "muon":
        redistribution, compile_choice = muon_tuning
        cuda = device_type == "cuda"
        kernel = adamw_kernel_kwargs("fused" if implementation == "triton" else implementation)
        return lambda groups: Muon(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, momentum=cfg.muon_momentum,
                                   nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps,
                                   ns_dtype=torch.bfloat16 if cuda else torch.float32,
                                   compiled=compile_choice == "on" or (compile_choice == "auto" and cuda),
                                   redistribution=redistribution, adamw_kernel=kernel)  # type: ignore[arg-type]
    if cfg.name != "adamw":
        raise ConfigError(f"optimizer.name={cfg.name!r} is not supported; use 'adamw', 'muon' or 'sgd'")
    if master_weights:
        return lambda groups: MasterWeightAdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, kernel=implementation,
                                                masters_for=masters_for)
    if implementation == "triton":
        return lambda groups: TritonAdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
    kernel = adamw_kernel_kwargs(implementation)
    return lambda groups: torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, **kernel)

