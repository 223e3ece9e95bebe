"""A step shared by the optimizer checks that run under Triton's interpreter (imports no triton)."""

from __future__ import annotations

import torch


def step_alongside(opt: torch.optim.Optimizer, ref_opt: torch.optim.Optimizer, scale: torch.Tensor | None,
                   params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """One step of `opt` (handed the clipping divisor `scale`, or None) and of its reference;
    `opt` must leave the gradients of `params` equal to `grads`. Then both LRs halve, as an LR
    schedule would change them between steps."""
    opt.grad_scale = scale
    opt.step()
    ref_opt.step()
    for p, g in zip(params, grads, strict=True):
        assert torch.equal(p.grad, g), "the gradients must be left as they were"
    for o in (opt, ref_opt):
        for group in o.param_groups:
            group["lr"] *= 0.5
