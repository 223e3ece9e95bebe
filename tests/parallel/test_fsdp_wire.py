"""fp32 sums of bf16 gradients sent as bf16 (kenotron/parallel/fsdp_wire.py): the all-to-all and
fp32 sum give an fp32 reduce-scatter's values, and the wire dtype is chosen only where the
gradients are bf16 and FSDP's hook can take the reduction."""

from __future__ import annotations

import torch

from kenotron.parallel.fsdp_wire import wire_dtype
from tests.distributed.pool import run_on_ranks


def test_fp32_sums_travel_as_bf16_only_for_bf16_gradients_under_plain_fsdp_on_cuda_with_the_hook():
    assert wire_dtype("float32", "bfloat16", "fsdp", "cuda", True) == "bfloat16"
    assert wire_dtype("bfloat16", "bfloat16", "fsdp", "cuda", True) == "bfloat16"
    # fp32 gradients would be rounded; HSDP, DDP, a CPU or a torch without the hook keep fp32.
    assert wire_dtype("float32", "float32", "fsdp", "cuda", True) == "float32"
    assert wire_dtype("float32", "bfloat16", "hsdp", "cuda", True) == "float32"
    assert wire_dtype("float32", "bfloat16", "ddp", "cuda", True) == "float32"
    assert wire_dtype("float32", "bfloat16", "fsdp", "cpu", True) == "float32"
    assert wire_dtype("float32", "bfloat16", "fsdp", "cuda", False) == "float32"


def _sums(op_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch.distributed as dist

    from kenotron.parallel.collectives import reduce_scatter_single
    from kenotron.parallel.fsdp_wire import all_to_all_sum

    op = getattr(dist.ReduceOp, op_name)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    # bf16 gradients of a wide range of magnitudes, so that bf16 partial sums would round.
    grads = (torch.randn(ranks * 96, generator=torch.Generator().manual_seed(rank))
             * torch.logspace(-3, 3, ranks * 96)).to(torch.bfloat16)
    wired = torch.empty(96, dtype=torch.float32)
    all_to_all_sum(wired, grads, None, op)
    fp32 = torch.empty(96, dtype=torch.float32)
    reduce_scatter_single(fp32, grads.float(), op=dist.ReduceOp.SUM)
    if op_name == "AVG":
        fp32 /= ranks
    rounded = torch.empty(96, dtype=torch.bfloat16)
    reduce_scatter_single(rounded, grads, op=dist.ReduceOp.SUM)
    return wired, fp32, rounded.float() / (ranks if op_name == "AVG" else 1)


def test_bf16_sent_fp32_summed_reduce_scatter_gives_the_fp32_reduce_scatter_values():
    for world in (2, 4):
        for op in ("SUM", "AVG"):
            for wired, fp32, rounded in run_on_ranks(world, _sums, op):
                # Up to the order of the additions: within an fp32 rounding of the largest term.
                assert torch.allclose(wired, fp32, rtol=2 ** -22, atol=0), (world, op)
                if world == 4:  # bf16 partial sums round where fp32 ones do not
                    assert (rounded - fp32).abs().max() > 1000 * (wired - fp32).abs().max(), (world, op)
