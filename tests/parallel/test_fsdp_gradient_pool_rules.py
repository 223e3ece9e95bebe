"""Which reduce-scatter outputs the compute-pool option holds to the end of the backward (they
become the gradients) and which it hands back as soon as the reduce-scatter stream is done with
them (cast or accumulated). Runs on a CPU: the rules read only dtypes and gradients."""

from __future__ import annotations

import torch
from torch import nn

from kenotron.parallel.fsdp_gradient_pool import becomes_gradients


def test_output_of_the_parameters_dtype_with_no_gradients_yet_becomes_the_gradients():
    params = [nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(2))]
    assert becomes_gradients(torch.float32, params)


def test_output_cast_to_the_parameters_dtype_does_not_become_the_gradients():
    params = [nn.Parameter(torch.zeros(4))]
    assert not becomes_gradients(torch.bfloat16, params)


def test_output_added_into_existing_gradients_does_not_become_the_gradients():
    params = [nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(2))]
    params[1].grad = torch.zeros(2)
    assert not becomes_gradients(torch.float32, params)


def test_module_without_parameters_of_its_own_holds_nothing():
    assert not becomes_gradients(torch.float32, [])


def _own_parameter_names() -> tuple[list[str], list[str]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from kenotron.parallel.fsdp_gradient_pool import own_parameters

    mesh = init_device_mesh("cpu", (1,))
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=False), nn.LayerNorm(4))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[1], mesh=mesh)
    fully_shard(model, mesh=mesh)
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for p in own_parameters(model)], [names[id(p)] for p in own_parameters(model[0])]


def test_own_parameters_of_an_fsdp_module_leave_out_its_nested_fsdp_modules():
    from tests.distributed.pool import run_on_ranks

    root, block = run_on_ranks(1, _own_parameter_names)[0]
    assert root == ["2.weight", "2.bias"]
    assert block == ["0.weight", "0.bias"]


def test_output_is_allocated_in_the_parameters_dtype_which_fsdp_would_cast_a_bf16_sum_to():
    from kenotron.parallel.fsdp_gradient_pool import output_dtype

    params = [nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(2))]
    assert output_dtype(torch.bfloat16, params) == torch.float32
    assert output_dtype(torch.float32, params) == torch.float32
    # The allocated output then becomes the gradients, held to the end of the backward.
    assert becomes_gradients(output_dtype(torch.bfloat16, params), params)
    assert output_dtype(torch.bfloat16, []) == torch.bfloat16


def _reduce_scatter_cast() -> tuple[torch.Tensor, torch.Tensor]:
    import torch.distributed as dist

    from kenotron.parallel.collectives import reduce_scatter_single
    from kenotron.parallel.fsdp_gradient_pool import reduce_scatter_into

    rank = dist.get_rank()
    grads = (torch.randn(8, generator=torch.Generator().manual_seed(rank)) / 3).to(torch.bfloat16)
    cast = torch.empty(4, dtype=torch.float32)
    reduce_scatter_into(cast, grads, None, dist.ReduceOp.SUM)
    plain = torch.empty(4, dtype=torch.bfloat16)
    reduce_scatter_single(plain, grads, op=dist.ReduceOp.SUM)
    return cast, plain.float()


def test_a_bf16_reduce_scatter_into_an_fp32_output_equals_the_bf16_sum_cast_after():
    from tests.distributed.pool import run_on_ranks

    for cast, plain in run_on_ranks(2, _reduce_scatter_cast):
        assert cast.dtype == torch.float32
        assert torch.equal(cast, plain)
