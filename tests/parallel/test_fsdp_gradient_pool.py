"""FSDP's sharded gradients come from the compute stream's memory pool with the option on (so
the next forward can reuse them once freed) and from the reduce-scatter stream's without it,
with the same values, and freed gradients are reusable by the compute stream at once. CUDA only:
on a CPU there are no streams and the option does nothing."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.pool import run_on_ranks


def _stream_of(ptr: int) -> int:
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= ptr < segment["address"] + segment["total_size"]:
            return segment["stream"]
    raise AssertionError(f"no segment holds address {ptr:#x}")


def _gradients_and_their_pools(reduce_dtype: torch.dtype) -> list[tuple[dict, set]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from kenotron.parallel.fsdp_gradient_pool import install_reduce_scatters

    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    compute = torch.cuda.current_stream().cuda_stream
    results = []
    for in_compute_pool in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(3))).cuda()
        for layer in model:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        if in_compute_pool:
            assert install_reduce_scatters([(m, None) for m in [*model, model]], torch.device("cuda"), True)
        x = torch.randn(64, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        model(x).float().square().mean().backward()
        torch.cuda.synchronize()
        grads = {n: p.grad.to_local().cpu() for n, p in model.named_parameters()}
        pools = {_stream_of(p.grad.to_local().data_ptr()) == compute for p in model.parameters()}
        results.append((grads, pools))
    return results


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16])
def test_cuda_sharded_gradients_come_from_the_compute_pool_with_the_same_values(reduce_dtype):
    # bf16: FSDP would cast the sum to the fp32 parameters' dtype on its own stream.
    (plain, plain_pools), (pooled, pooled_pools) = run_on_ranks(1, _gradients_and_their_pools, reduce_dtype)[0]
    assert plain_pools == {False}  # the reduce-scatter stream's pool
    assert pooled_pools == {True}
    assert plain.keys() == pooled.keys()
    for name, grad in plain.items():
        assert torch.equal(grad, pooled[name]), name


def _block_states(addresses: set[int]) -> set[str]:
    """The allocator's state of each block that holds one of `addresses`."""
    states = set()
    for segment in torch.cuda.memory_snapshot():
        start = segment["address"]
        for block in segment["blocks"]:
            if any(start <= a < start + block["size"] for a in addresses):
                states.add(block["state"])
            start += block["size"]
    return states


def _freed_gradient_states_while_the_gpu_is_behind() -> set[str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from kenotron.parallel.fsdp_gradient_pool import install_reduce_scatters

    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(3))).cuda()
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    assert install_reduce_scatters([(m, None) for m in [*model, model]], torch.device("cuda"), True)
    loss = model(torch.randn(64, 1024, device="cuda")).float().square().mean()
    # Keep the GPU ~1 s behind the host, as in training, so the reduce-scatters are still
    # queued when the gradients are freed.
    torch.cuda._sleep(2_000_000_000)
    loss.backward()
    freed = {p.grad.to_local().data_ptr() for p in model.parameters()}
    model.zero_grad(set_to_none=True)
    states = _block_states(freed)
    torch.cuda.synchronize()
    return states


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_freed_gradients_are_free_at_once_while_the_gpu_is_behind():
    # "active_pending_free" is a block freed under record_stream whose other stream's work is
    # not done: not reusable until the allocator sees it done.
    assert run_on_ranks(1, _freed_gradient_states_while_the_gpu_is_behind)[0] == {"inactive"}
