"""torch's context-parallel attention (kenotron's CUDA path) checked on CPU/gloo.

torch's ring has no CPU kernel, so these tests teach its dispatcher the CPU flash-attention op
for the duration of a call: the handlers below route it into torch's own
`_templated_ring_attention(_backward)`, exactly as torch routes the CUDA flash / cuDNN ops.
What is checked is everything except the CUDA kernels: kenotron's head-tail layout is the one
torch's load-balanced ring assumes, the `_ContextParallel` wrapping of `TorchRingAttention`, the
options it sets (load balancing, rotation), grouped kv heads, and the backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from kenotron.dtensor import local_tensor
from kenotron.parallel.context import SequenceLayout
from kenotron.parallel.context.torch_ring import (
    TorchRingAttention,
    configure_torch_context_parallel,
    torch_cp_api,
)
from tests.distributed.pool import run_on_ranks
from tests.parallel.test_context_attention import (
    SEQ,
    _assemble,
    _assert_close,
    _qkv,
    _reference,
)

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _cpu_forward(op_call, args, kwargs):
    q, k, v, *rest = args
    dropout_p, is_causal = (list(rest) + [0.0, False])[:2]
    mesh = q.device_mesh
    out, lse = torch_cp_api()._templated_ring_attention(
        mesh.get_group(), 2, CPU_FLASH, local_tensor(q), local_tensor(k), local_tensor(v), is_causal=is_causal,
        dropout_p=dropout_p, scale=kwargs.get("scale"),
    )
    return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in (out, lse))


def _cpu_backward(op_call, args, kwargs):
    grad_out, q, k, v, out, lse, dropout_p, is_causal = args
    mesh = q.device_mesh
    grads = torch_cp_api()._templated_ring_attention_backward(
        mesh.get_group(), 2, CPU_FLASH_BACKWARD, local_tensor(grad_out), "grad_out", local_tensor(q), local_tensor(k),
        local_tensor(v), local_tensor(out), local_tensor(lse), is_causal, dropout_p=dropout_p, scale=kwargs.get("scale"),
    )
    return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in grads[:3])


def _torch_ring_rank(q, k, v, grad_out, load_balance: bool, rotate_method: str):
    api = torch_cp_api()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    rank = mesh.get_local_rank()
    try:
        attention = TorchRingAttention(mesh, load_balance, rotate_method)
        handlers = DTensor._op_dispatcher._custom_op_handlers
        DTensor._op_dispatcher._custom_op_handlers = {
            **handlers, CPU_FLASH: _cpu_forward, CPU_FLASH_BACKWARD: _cpu_backward,
        }
        layout = SequenceLayout(SEQ, mesh.size(), load_balance)
        local = [layout.shard(t, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = attention(*local)
        assert not isinstance(out, DTensor), "the style's output hook hands back the local shard"
        out.backward(layout.shard(grad_out, rank, dim=2))
        return {"out": out.detach(), "grads": [t.grad for t in local], "dp_rank": 0, "cp_rank": rank}
    finally:
        # torch keeps these process-wide; the worker runs other tests next.
        api._disable_context_parallel_dispatcher()
        configure_torch_context_parallel(True, "allgather")
        api._disable_context_parallel_dispatcher()


@pytest.mark.parametrize("rotate_method", ["allgather", "alltoall"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("cp", [2, 4])
def test_torch_ring_on_kenotron_layout_matches_sdpa(cp, load_balance, rotate_method):
    q, k, v, grad_out = _qkv(batch=2, heads=4, kv_heads=2, seed=4)
    results = run_on_ranks(cp, _torch_ring_rank, q, k, v, grad_out, load_balance, rotate_method)
    _assert_close(_assemble(results, SequenceLayout(SEQ, cp, load_balance)), _reference(q, k, v, grad_out))


def _changed_options_rank():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    try:
        attention = TorchRingAttention(mesh, load_balance=True)
        torch_cp_api()._cp_options.enable_load_balance = False  # someone else reconfigures torch
        x = torch.zeros(1, 2, 4, 8)
        attention(x, x, x)
    finally:
        configure_torch_context_parallel(True, "allgather")
        torch_cp_api()._disable_context_parallel_dispatcher()


def test_torch_ring_refuses_options_changed_behind_its_back():
    from tests.distributed.pool import RankError

    with pytest.raises(RankError, match=r"options changed to \(load_balance, rotate_method\) = \(False, 'allgather'\)"):
        run_on_ranks(2, _changed_options_rank)
