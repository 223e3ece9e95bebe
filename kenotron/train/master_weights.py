"""bf16 parameters whose fp32 master copies live in the optimizer (`tuning.mixed_precision = "master_weights"`).

Under autocast the model keeps fp32 parameters and every step casts each weight to bf16 for
its matmul (forward), then widens each bf16 weight gradient back to fp32 for the parameter
(backward): 12 bytes of extra traffic per parameter and step, plus an fp32 residual stream. Here the parameters themselves are bf16 (so are the activations and the weight
gradients), and the fp32 values the updates accumulate into are a `master` entry of each
parameter's optimizer state. The update reads the bf16 gradient and the fp32 master and moments
and writes the master, the moments and the bf16 parameter: with the Triton kernel the same 28
bytes per parameter as an fp32 AdamW step, so the casts are gone and nothing is added.

The numbers are AdamW's on the fp32 masters, as with autocast; what differs is that gradients
are bf16 (as autocast's matmuls already produce them, but a tied embedding's two contributions
are summed in bf16) and the residual stream is bf16, as under FSDP's mixed precision.

Checkpoints: the model part holds the bf16 parameters and the optimizer part their fp32 masters
(`state.<name>.master`), so a run resumes exactly. Loading the model part alone (a model-only
checkpoint, or `checkpoint.exclude_from_loading = ["optimizer"]`) sets the masters from the
loaded weights (`masters_from_params`, called by the checkpoint manager). A checkpoint saved
without master weights lacks the `master` entry: resuming it here stops with an error naming it;
leave the optimizer out to start from its weights rounded to bf16.

Some parameters only (`masters_for`): under expert parallelism the routed experts outside FSDP
(parallel/data_parallel.py's experts_outside_fsdp) train as one GPU does, bf16 with fp32
masters, while the FSDP units beside them keep fp32 parameters that FSDP casts, stepped here by
the same kernel with no master. Their checkpoint differs from the whole-model case: the model
part holds each expert's fp32 master under the expert's own name (`checkpointed_master`,
checkpoint/state.py's ModelState) and the optimizer part no `master` entry, which is the layout
of fp32 experts: a checkpoint moves between ep 2 on 2 ranks and layouts whose experts are FSDP
units (fp32) without rounding anything.
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from kenotron.dtensor import local_tensor
from kenotron.train.closure import closure_loss

KERNELS = ("triton", "fused", "foreach", "for-loop")


def _fresh_state(like: torch.Tensor, master: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """torch's AdamW state for an fp32 tensor `like`, with `master` when there is one."""
    state = {
        # A CPU step counter, as torch's non-fused AdamW keeps it (read without a device sync).
        "step": torch.tensor(0.0, dtype=torch.float32),
        "exp_avg": torch.zeros_like(like, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(like, memory_format=torch.preserve_format),
    }
    if master is not None:
        state["master"] = master
    return state


def _to_dtype(p: torch.Tensor, dtype: torch.dtype) -> None:
    """`p` in `dtype`, the same Parameter object. A DTensor keeps its local shard in an attribute
    that `p.data = ...` leaves as it was (the wrapper would say bf16 over an fp32 shard): its
    contents are swapped with a converted copy's instead."""
    if isinstance(p, DTensor):
        torch.utils.swap_tensors(p, nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad))
    else:
        p.data = p.data.to(dtype)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over fp32 master copies of low-precision parameters.

    Constructing it takes each parameter's current (fp32) value as its master and turns the
    parameter itself into `param_dtype` (same Parameter object, so modules, compiled graphs and
    checkpoint names follow). `kernel`: "triton" (one kernel per tensor, also writes the bf16
    parameter; CUDA), or torch's "fused" / "foreach" / "for-loop" AdamW run on the masters with
    fp32 copies of the gradients, followed by a copy into the parameters. `masters_for`: the
    parameters that get masters (None: all); the others stay fp32 and are stepped as torch's
    AdamW steps them, by the same kernel.
    """

    # The trainer's clipping hands its divisor over as `grad_scale` when the kernel divides.
    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float = 0.01,
                 kernel: str = "foreach", param_dtype: torch.dtype = torch.bfloat16,
                 masters_for: Collection[torch.Tensor] | None = None) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r} is not one of {', '.join(map(repr, KERNELS))}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False, fused=False)
        self.kernel = kernel
        self.divides_by_grad_scale = kernel in ("triton", "fused")
        self.grad_scale: torch.Tensor | None = None
        self.some_only = masters_for is not None
        self._mastered = {id(p) for p in (masters_for if masters_for is not None else self._params())}
        with torch.no_grad():
            for p in self._params():
                if p.dtype != torch.float32:
                    raise ValueError(f"MasterWeightAdamW takes fp32 parameters (masters are taken from them), got "
                                     f"{p.dtype}")
                mastered = self.has_master(p)
                self.state[p] = _fresh_state(p, p.detach().clone() if mastered else None)
                if mastered:
                    _to_dtype(p, param_dtype)

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def has_master(self, p: torch.Tensor) -> bool:
        """Whether `p` is a low-precision parameter with an fp32 master here."""
        return id(p) in self._mastered

    def checkpointed_master(self, p: torch.Tensor) -> torch.Tensor | None:
        """The fp32 master the model part of a checkpoint holds in place of `p` (some parameters
        only, `masters_for`), else None (the parameter itself is saved)."""
        return self.state[p]["master"] if self.some_only and self.has_master(p) else None

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for masters in (True, False):
                subset = [p for p in params if self.has_master(p) == masters]
                if not subset:
                    continue
                states = [self.state[p] for p in subset]
                if self.kernel == "triton":
                    # Importing it imports triton: only when chosen.
                    from kenotron.kernels.adamw import adamw_step_group

                    adamw_step_group(group, subset, states, self.grad_scale, masters=masters)
                else:
                    self._torch_step(group, subset, states, masters)
        return loss

    def _torch_step(self, group: dict[str, Any], params: list[torch.Tensor], states: list[dict], masters: bool) -> None:
        fused = self.kernel == "fused"
        targets = [s["master"] for s in states] if masters else params
        if fused:  # torch's fused kernel counts steps on the device
            for state, target in zip(states, targets, strict=True):
                if state["step"].device != target.device:
                    state["step"] = state["step"].to(target.device)
        beta1, beta2 = group["betas"]
        adamw(
            targets, [p.grad.float() for p in params] if masters else [p.grad for p in params],
            [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
            foreach=self.kernel == "foreach", fused=fused, grad_scale=self.grad_scale if fused else None,
            amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False,
        )
        if masters:  # on the local shards: DTensor has no sharding rule for _foreach_copy_
            torch._foreach_copy_([local_tensor(p) for p in params], [local_tensor(m) for m in targets])

    @torch.no_grad()
    def masters_from_params(self) -> None:
        """Set every master to its parameter's value: after the parameters alone were loaded (a
        model-only checkpoint, or the optimizer part left out), the masters would otherwise
        still hold the weights of the initialisation and the first step would bring them back.
        With some parameters only, the model part loads their masters themselves: nothing to do."""
        if self.some_only:
            return
        for p in self._params():
            self.state[p]["master"].copy_(p)

    def state_dict(self) -> dict[str, Any]:
        """torch's, without the masters the model part of a checkpoint holds (`checkpointed_master`)."""
        saved = super().state_dict()
        if self.some_only:
            for index, p in enumerate(self._params()):  # torch numbers the parameters in group order
                if self.checkpointed_master(p) is not None and index in saved["state"]:
                    saved["state"][index] = {k: v for k, v in saved["state"][index].items() if k != "master"}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading casts every floating state tensor to its parameter's dtype, which would
        round the masters and moments to bf16: the state is put back here, in fp32."""
        saved_state = state_dict["state"]
        current = dict(self.state)  # parameters the saved state does not mention keep theirs
        super().load_state_dict({**state_dict, "state": {}})
        self.state.update(current)
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        for saved_id, p in zip(saved_ids, self._params(), strict=True):
            if saved_id not in saved_state:
                continue
            state = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in saved_state[saved_id].items()}
            master = self.checkpointed_master(p)
            if master is not None:  # the model part loaded it (checkpoint/state.py's ModelState)
                state["master"] = master
            elif not self.has_master(p):
                state.pop("master", None)  # saved with master weights, stepped in fp32 here
            elif "master" not in state:
                raise KeyError(f"optimizer state of a {tuple(p.shape)} parameter has no fp32 'master' entry: it was "
                               f"saved without master weights")
            for key in ("master", "exp_avg", "exp_avg_sq") if self.has_master(p) else ("exp_avg", "exp_avg_sq"):
                state[key] = state[key].to(device=p.device, dtype=torch.float32)
            step = state["step"]
            state["step"] = step.to(device=p.device if self.kernel == "fused" else "cpu", dtype=torch.float32)
            self.state[p] = state
            if master is None and self.has_master(p):
                p.data.copy_(state["master"])
