"""Run by test_adamw.py in a child process with TRITON_INTERPRET=1 (Triton's CPU interpreter):
TritonAdamW against torch.optim.AdamW. Exits non-zero on a mismatch, prints "ok" last."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from kenotron.train.optim import TritonAdamW
from tests.train.optimizer_steps import step_alongside

HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8}


def make_params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # 3000 and 1000x3: sizes that are not a multiple of the kernel's block.
    return [torch.randn(s, generator=g).requires_grad_() for s in ((3000,), (1000, 3), (17,))]


def set_grads(params: list[torch.Tensor], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def groups(params: list[torch.Tensor]) -> list[dict]:
    return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]


def check_equals_torch_adamw_with_lr_changes_and_clipping() -> None:
    ours, ref = make_params(0), make_params(0)
    opt, ref_opt = TritonAdamW(groups(ours), **HYPER), torch.optim.AdamW(groups(ref), foreach=False, **HYPER)
    for step in range(1, 5):
        set_grads(ours, step)
        set_grads(ref, step)
        scale = torch.tensor(1.0 + step) if step % 2 == 0 else None  # the clipping divisor on even steps
        if scale is not None:
            for p in ref:
                p.grad /= scale
        step_alongside(opt, ref_opt, scale, ours, [p.grad.clone() for p in ours])
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            # torch blends the first moment with lerp, the kernel as b1*m + (1-b1)*g: equal to rounding.
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], rtol=1e-6, atol=1e-7)
        assert float(opt.state[p]["step"]) == float(ref_opt.state[q]["step"]) == 4


def check_state_dict_moves_between_implementations() -> None:
    ours, ref = make_params(1), make_params(1)
    opt, ref_opt = TritonAdamW(groups(ours), **HYPER), torch.optim.AdamW(groups(ref), foreach=False, **HYPER)
    for step in (1, 2):
        set_grads(ours, step)
        set_grads(ref, step)
        opt.step()
        ref_opt.step()
    # torch's state into ours, ours into torch's: both continue as one run would.
    swapped = TritonAdamW(groups(ref), **HYPER)
    swapped.load_state_dict(ref_opt.state_dict())
    swapped_ref = torch.optim.AdamW(groups(ours), foreach=False, **HYPER)
    swapped_ref.load_state_dict(opt.state_dict())
    set_grads(ours, 3)
    set_grads(ref, 3)
    swapped.step()
    swapped_ref.step()
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def check_dtensor_parameters_update_through_their_shards() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            mesh = init_device_mesh("cpu", (1,))
            plain = make_params(2)
            sharded = [distribute_tensor(p.detach().clone(), mesh, [Shard(0)]).requires_grad_() for p in plain]
            opt = TritonAdamW(groups(sharded), **HYPER)
            ref_opt = torch.optim.AdamW(groups(plain), foreach=False, **HYPER)
            set_grads(plain, 1)
            for p, q in zip(sharded, plain, strict=True):
                p.grad = distribute_tensor(q.grad.clone(), mesh, [Shard(0)])
            opt.step()
            ref_opt.step()
            for p, q in zip(sharded, plain, strict=True):
                torch.testing.assert_close(p.full_tensor(), q, rtol=1e-6, atol=1e-6)
        finally:
            dist.destroy_process_group()


def check_strided_programs_update_bit_for_bit_like_one_program_per_block() -> None:
    from kenotron.kernels.adamw import adamw_update_

    g = torch.Generator().manual_seed(3)
    # 5000 elements: five blocks of 1024, the last one partial; 2 programs stride over them.
    base = [torch.randn(5000, generator=g) for _ in range(3)]
    results = []
    for programs in (None, 2, 64):
        p, m, master = base[0].to(torch.bfloat16), base[1].abs(), base[0].clone()
        v = m * m
        adamw_update_(p, base[2].to(torch.bfloat16), m, v, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                      weight_decay=0.1, step=2, grad_scale=torch.tensor(1.5), master=master, programs=programs)
        results.append((p, m, v, master))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(results[0][3], base[0])


if __name__ == "__main__":
    check_strided_programs_update_bit_for_bit_like_one_program_per_block()
    check_equals_torch_adamw_with_lr_changes_and_clipping()
    check_state_dict_moves_between_implementations()
    check_dtensor_parameters_update_through_their_shards()
    print("ok")
