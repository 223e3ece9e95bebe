"""The AdamW update as one Triton kernel per parameter tensor (`tuning.adamw_implementation = "triton"`;
the optimizer around it is kenotron.train.optim.TritonAdamW).

The update is memory-bound: per parameter it reads the weight, gradient and both moments and
writes the weight and moments (28 bytes in fp32). One plain Triton kernel per tensor, 1024
elements per program, moves them faster than torch's fused multi-tensor-apply kernel
(docs/performance.md has the figures).

The math is torch's AdamW (decoupled weight decay, bias-corrected moments, eps outside the
square root) computed in fp32, and the state is torch's (`step`, `exp_avg`, `exp_avg_sq`), so
checkpoints move between this and torch's implementations. Like torch's fused AdamW it takes
the gradient clipping divisor as `grad_scale` (the AMP GradScaler protocol) and divides inside
the kernel, leaving the gradients untouched. DTensor parameters (FSDP, TP) are updated through
their local shards: the update is elementwise. On fake tensors (the memory estimator) it
creates the state and launches nothing.

Importing this module needs the `triton` package; the kernel needs CUDA (or Triton's CPU
interpreter, TRITON_INTERPRET=1, which the tests use).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kenotron.dtensor import local_tensor

BLOCK = 1024  # the fastest of 1024-8192 (scripts/bench_optimizer.py; docs/performance.md)


@triton.jit
def _adamw_block(
    offs, p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, scale_ptr, n,
    decay, beta1, beta2, eps, step_size, bias_correction2_sqrt,
    HAS_SCALE: tl.constexpr, HAS_MASTER: tl.constexpr,
):
    mask = offs < n
    # With a master copy (w, fp32) the update reads it instead of the (bf16) parameter and
    # writes both: the parameter is the master rounded to its dtype.
    if HAS_MASTER:
        p = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    else:
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    if HAS_SCALE:
        g = g / tl.load(scale_ptr)
    m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    p = p * decay
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
    if HAS_MASTER:
        tl.store(w_ptr + offs, p, mask=mask)
        # Rounded to nearest even, as torch's casts round (Triton's CPU interpreter truncates instead).
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adamw_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, scale_ptr, n,
    decay, beta1, beta2, eps, step_size, bias_correction2_sqrt,
    HAS_SCALE: tl.constexpr, HAS_MASTER: tl.constexpr, BLOCK: tl.constexpr, STRIDED: tl.constexpr,
):
    # STRIDED: a fixed number of programs walks the tensor (occupying that many SMs while it
    # runs beside other work); else one program per block.
    first = tl.program_id(0).to(tl.int64) * BLOCK
    if STRIDED:
        for start in range(first, n, tl.num_programs(0) * BLOCK):
            _adamw_block(start + tl.arange(0, BLOCK), p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, scale_ptr, n,
                         decay, beta1, beta2, eps, step_size, bias_correction2_sqrt, HAS_SCALE, HAS_MASTER)
    else:
        _adamw_block(first + tl.arange(0, BLOCK), p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, scale_ptr, n,
                     decay, beta1, beta2, eps, step_size, bias_correction2_sqrt, HAS_SCALE, HAS_MASTER)


def adamw_update_(
    param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
    grad_scale: torch.Tensor | None = None, master: torch.Tensor | None = None, programs: int | None = None,
) -> None:
    """One AdamW step on one tensor, in place (param, exp_avg, exp_avg_sq), `step` counted from 1.

    `master`: an fp32 copy of a lower-precision `param` (kenotron/train/master_weights.py); the
    step updates it and writes `param` as its rounding, in the same pass. `programs`: launch at
    most that many programs, each striding over the tensor (None: one per BLOCK elements)."""
    tensors = [local_tensor(t) for t in (param, grad, exp_avg, exp_avg_sq)]
    tensors.append(local_tensor(master) if master is not None else tensors[0])  # unused pointer without a master
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("tuning.adamw_implementation='triton' needs contiguous parameters, gradients and moments; "
                         "use tuning.adamw_implementation='fused' for this model")
    n = tensors[0].numel()
    if n == 0:
        return
    scale = grad_scale if grad_scale is not None else tensors[0]  # any pointer: unused without HAS_SCALE
    blocks = triton.cdiv(n, BLOCK)
    strided = programs is not None and programs < blocks
    _adamw_kernel[(programs if strided else blocks,)](
        *tensors, scale, n,
        1.0 - lr * weight_decay, beta1, beta2, eps, lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step),
        HAS_SCALE=grad_scale is not None, HAS_MASTER=master is not None, BLOCK=BLOCK, STRIDED=strided,
        num_warps=4,
    )


def adamw_step_group(group: dict[str, Any], params: list[torch.Tensor], states: list[dict],
                     grad_scale: torch.Tensor | None, masters: bool = False) -> None:
    """One `adamw_update_` per parameter of a group (those with gradients, with their states),
    counting each state's CPU step; `masters`: the states hold fp32 masters of the parameters."""
    beta1, beta2 = group["betas"]
    fake = torch._subclasses.fake_tensor.is_fake(params[0])
    for p, state in zip(params, states, strict=True):
        state["step"] += 1
        if fake:
            continue  # the estimator's dry run: the state is what costs memory
        adamw_update_(
            p, p.grad, state["exp_avg"], state["exp_avg_sq"], lr=float(group["lr"]), beta1=beta1, beta2=beta2,
            eps=group["eps"], weight_decay=group["weight_decay"], step=int(state["step"]),
            grad_scale=grad_scale, master=state["master"] if masters else None,
        )
