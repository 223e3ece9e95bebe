"""Muon for the hidden matrices, AdamW for the rest, as one torch optimizer.

One optimizer (not two) so that the trainer's one LR schedule, ZeRO-1's partition, FSDP's early
all-gather and the checkpoints' state dicts treat it like AdamW. A group with `muon=True` holds
matrices (2-D, or 3-D batches of matrices such as MoE experts); the others are plain AdamW
groups (torch's own functional AdamW steps them: same state layout as torch.optim.AdamW).

A Muon group's step, per matrix (torch.optim.Muon's, with Nesterov momentum by default):

    B <- mu B + (1 - mu) G                    momentum buffer (state "momentum_buffer", like p)
    U <- (1 - mu) G + mu B   (Nesterov)  or   B
    O <- NewtonSchulz(U)                      the whole matrix, however it is sharded (muon_layout.py)
    W <- W (1 - lr wd) - lr * update_scale * O

`update_scale` is the group's learning-rate rule (train/optim.py: Moonlight's 0.2 sqrt(max(m, n)),
or its spectral µP form), so the configured lr and weight decay are AdamW's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam

from kenotron.dtensor import local_tensor
from kenotron.train.closure import closure_loss
from kenotron.train.muon_layout import Redistribution, orthogonalize
from kenotron.train.newton_schulz import newton_schulz_fn


class Muon(torch.optim.Optimizer):
    """Muon (groups with `muon=True`, each with its `update_scale`) and AdamW (the other groups).

    `ns_dtype`: Newton–Schulz's precision (bf16 on GPUs; fp32 keeps CPU parity tests exact);
    `compiled`: Newton–Schulz through torch.compile; `redistribution`: how sharded matrices are
    made whole (muon_layout.py); `adamw_kernel`: torch AdamW's fused / foreach flags.
    """

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float], eps: float,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 ns_dtype: torch.dtype = torch.bfloat16, compiled: bool = False,
                 redistribution: Redistribution = "owner", adamw_kernel: dict[str, bool] | None = None) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0, "muon": False,
                    "update_scale": 1.0, "momentum": momentum, "nesterov": nesterov}
        super().__init__(groups, defaults)
        self.ns_steps, self.ns_dtype, self.redistribution = ns_steps, ns_dtype, redistribution
        self._ns = newton_schulz_fn(compiled)
        self.adamw_kernel = adamw_kernel or {"fused": False, "foreach": False}
        for group in self.param_groups:
            if group["muon"]:
                for p in group["params"]:
                    if p.ndim not in (2, 3):
                        raise ValueError(f"Muon steps matrices (2-D) or batches of them (3-D), got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["muon"]:
                self._muon_step(group, params)
            else:
                self._adamw_step(group, params)
        return loss

    def _ns_local(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:  # a rank that owns no matrix of this batch (fewer matrices than ranks)
            return x.to(self.ns_dtype)
        return self._ns(x, self.ns_steps, self.ns_dtype)

    def _muon_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        mu, lr = group["momentum"], group["lr"]
        updates = []
        for p in params:
            grad = p.grad
            if isinstance(grad, DTensor) and grad.placements != p.placements:
                grad = grad.redistribute(p.device_mesh, p.placements)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            buf, g = local_tensor(state["momentum_buffer"]), local_tensor(grad)
            buf.lerp_(g, 1 - mu)
            update = g.lerp(buf, mu) if group["nesterov"] else buf
            # The sharded layout of the parameter, on this rank's shard of the update.
            updates.append(DTensor.from_local(update, p.device_mesh, p.placements, run_check=False,
                                              shape=p.shape, stride=p.stride()) if isinstance(p, DTensor) else update)
        ortho = orthogonalize(updates, self._ns_local, self.redistribution, self.ns_dtype)
        for p, o in zip(params, ortho):
            w = local_tensor(p)
            w.mul_(1 - lr * group["weight_decay"])
            w.add_(o.to(w.dtype), alpha=-lr * group["update_scale"])

    def _adamw_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                # torch.optim.AdamW's layout: a CPU step counter and moments like p.
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        fused = self.adamw_kernel.get("fused", False) and params[0].device.type == "cuda"
        if fused:  # the fused kernel wants its step counters on the parameters' device
            for p, s in zip(params, steps):
                if s.device != p.device:
                    self.state[p]["step"] = s.to(local_tensor(p).device)
            steps = [self.state[p]["step"] for p in params]
        beta1, beta2 = group["betas"]
        adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=self.adamw_kernel.get("foreach", False),
             fused=fused or None, decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
             lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
