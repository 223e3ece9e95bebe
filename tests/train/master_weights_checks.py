"""Checks of MasterWeightAdamW shared by test_master_weights.py (torch's kernels, in process) and,
through `python tests/train/master_weights_checks.py` under TRITON_INTERPRET=1, the Triton kernel
(Triton's CPU interpreter). As a script it prints "ok" last and exits non-zero on a mismatch."""

from __future__ import annotations

import os
import sys

import torch

from kenotron.train.master_weights import MasterWeightAdamW
from tests.train.optimizer_steps import step_alongside

HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8}


def make_params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    # 3000 and 1000x3: sizes that are not a multiple of the Triton kernel's block.
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((3000,), (1000, 3), (17,))]


def groups(params: list[torch.Tensor]) -> list[dict]:
    return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]


def bf16_grads(params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g).bfloat16() for p in params]


def bf16_rounding(master: torch.Tensor, kernel: str) -> torch.Tensor:
    """The parameter the kernel writes from its master: rounded to nearest even like torch's casts
    (on a GPU the Triton kernel too), truncated by Triton's CPU interpreter."""
    if kernel == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        return (master.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()
    return master.bfloat16()


def check_masters_follow_fp32_adamw_and_params_are_their_rounding(kernel: str) -> None:
    """The masters take exactly the steps fp32 AdamW takes from the (bf16) gradients, the
    parameters stay the same objects, bf16, equal to the masters rounded; the gradients are
    left alone; the clipping divisor is applied where the kernel takes it."""
    ours, ref = make_params(0), make_params(0)
    ids = [id(p) for p in ours]
    opt = MasterWeightAdamW(groups(ours), kernel=kernel, **HYPER)
    ref_opt = torch.optim.AdamW(groups(ref), foreach=False, **HYPER)
    assert [id(p) for p in ours] == ids and all(p.dtype == torch.bfloat16 for p in ours)
    for p, q in zip(ours, ref, strict=True):
        assert torch.equal(opt.state[p]["master"], q.detach()), "the masters are the fp32 initial values"
    for step in range(1, 5):
        grads = bf16_grads(ours, step)
        scale = torch.tensor(1.0 + step) if step % 2 == 0 and opt.divides_by_grad_scale else None
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad = g.clone()
            q.grad = g.float() / scale if scale is not None else g.float()
        step_alongside(opt, ref_opt, scale, ours, grads)
    for p, q in zip(ours, ref, strict=True):
        state = opt.state[p]
        assert state["master"].dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
        torch.testing.assert_close(state["master"], q.detach(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(state["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"], rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach(), bf16_rounding(state["master"], kernel))
        assert float(state["step"]) == 4


def check_state_dict_round_trip_keeps_fp32_state(kernel: str) -> None:
    """A fresh optimizer loading the state dict continues exactly as the original: masters and
    moments come back fp32 (torch's own loading would round them to the parameters' bf16)."""
    first, second = make_params(1), make_params(2)
    opt = MasterWeightAdamW(groups(first), kernel=kernel, **HYPER)
    for step in (1, 2):
        for p, g in zip(first, bf16_grads(first, step), strict=True):
            p.grad = g
        opt.step()
    resumed = MasterWeightAdamW(groups(second), kernel=kernel, **HYPER)
    resumed.load_state_dict(opt.state_dict())
    for p, q in zip(first, second, strict=True):
        assert resumed.state[q]["master"].dtype == torch.float32
        assert torch.equal(resumed.state[q]["master"], opt.state[p]["master"])
        assert torch.equal(q.detach(), opt.state[p]["master"].bfloat16()), "parameters are set from the masters"
    for params, o in ((first, opt), (second, resumed)):
        for p, g in zip(params, bf16_grads(params, 3), strict=True):
            p.grad = g
        o.step()
    for p, q in zip(first, second, strict=True):
        assert torch.equal(opt.state[p]["master"], resumed.state[q]["master"])
        assert torch.equal(opt.state[p]["exp_avg"], resumed.state[q]["exp_avg"])


if __name__ == "__main__":
    for name in sys.argv[1:] or ["triton"]:
        check_masters_follow_fp32_adamw_and_params_are_their_rounding(name)
        check_state_dict_round_trip_keeps_fp32_state(name)
    print("ok")
