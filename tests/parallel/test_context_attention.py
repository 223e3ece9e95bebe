"""Context-parallel attention on CPU/gloo: the sequence layout and kenotron's ring attention.

Reference: `scaled_dot_product_attention(is_causal=True)` on the whole sequence in one process.
The ranks each get their slice of q/k/v (in the layout under test), run ring attention and
back-propagate their slice of a fixed output gradient; the slices are put back together and
compared (fp32: outputs and q/k/v gradients within 1e-5).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from kenotron.parallel.context import (
    RingAttention,
    SequenceLayout,
    ring_attention,
    shard_batch,
)
from tests.distributed.pool import run_on_ranks

SEQ, HEAD_DIM = 32, 8


def _qkv(batch: int, heads: int, kv_heads: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, SEQ, HEAD_DIM, generator=gen)
    k = torch.randn(batch, kv_heads, SEQ, HEAD_DIM, generator=gen)
    v = torch.randn(batch, kv_heads, SEQ, HEAD_DIM, generator=gen)
    grad_out = torch.randn(batch, heads, SEQ, HEAD_DIM, generator=gen)
    return q, k, v, grad_out


def _reference(q, k, v, grad_out):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def _ring_rank(q, k, v, grad_out, load_balance: bool, rotate_method: str, dp: int = 1):
    """On each rank: its slice of everything, ring attention over the cp group, slices back.

    With dp > 1 the ranks form a (dp, cp) mesh and replica i attends over batch row i, so the
    cp groups are sub-groups whose global ranks differ from their group ranks."""
    world = dist.get_world_size()
    cp = world // dp
    mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
    cp_rank, dp_rank = mesh["cp"].get_local_rank(), mesh["dp"].get_local_rank()
    layout = SequenceLayout(SEQ, cp, load_balance)
    rows = slice(dp_rank, dp_rank + 1) if dp > 1 else slice(None)
    local = [layout.shard(t[rows], cp_rank, dim=2).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, mesh["cp"].get_group(), load_balance=load_balance, rotate_method=rotate_method)
    out.backward(layout.shard(grad_out[rows], cp_rank, dim=2))
    return {"out": out.detach(), "grads": [t.grad for t in local], "dp_rank": dp_rank, "cp_rank": cp_rank}


def _assemble(results: list[dict], layout: SequenceLayout, dp: int = 1) -> list[torch.Tensor]:
    """Whole-sequence out, dq, dk, dv from every rank's slices (rows stacked over dp)."""
    rows = []
    for d in range(dp):
        ranks = sorted((r for r in results if r["dp_rank"] == d), key=lambda r: r["cp_rank"])
        tensors = [[r["out"], *r["grads"]] for r in ranks]
        rows.append([layout.unshard([t[i] for t in tensors], dim=2) for i in range(4)])
    return [torch.cat([row[i] for row in rows]) for i in range(4)]


def _assert_close(got: list[torch.Tensor], want: tuple[torch.Tensor, ...]) -> None:
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


# -- the layout -------------------------------------------------------------------------------


def test_load_balanced_layout_gives_each_rank_a_head_and_a_tail_chunk():
    layout = SequenceLayout(16, 4)
    assert [layout.chunks_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert layout.positions(1).tolist() == [2, 3, 12, 13]
    assert SequenceLayout(16, 4, load_balance=False).positions(1).tolist() == [4, 5, 6, 7]


def test_load_balanced_layout_is_torch_head_tail_layout():
    # torch's context-parallel attention assumes exactly this order of tokens on the ranks.
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )

    for seq, cp in ((16, 2), (32, 4), (24, 3)):
        ours = torch.cat([SequenceLayout(seq, cp).positions(r) for r in range(cp)])
        torch.testing.assert_close(ours, _HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices()[0].long())


@pytest.mark.parametrize("load_balance", [True, False])
def test_shard_then_unshard_restores_the_sequence(load_balance):
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    layout = SequenceLayout(24, 3, load_balance)
    shards = [layout.shard(x, r) for r in range(3)]
    assert all(s.shape == (2, 8, 3) for s in shards)
    torch.testing.assert_close(layout.unshard(shards), x)
    for r in range(3):  # each token keeps its own position
        torch.testing.assert_close(layout.shard(torch.arange(24)[None], r)[0], layout.positions(r))


def test_shard_batch_keeps_inputs_labels_and_positions_aligned():
    inputs = torch.arange(16).view(1, 16)
    part = shard_batch(inputs, inputs + 1, SequenceLayout(16, 2), rank=1)
    assert part.inputs.tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    torch.testing.assert_close(part.labels, part.inputs + 1)
    torch.testing.assert_close(part.positions, part.inputs[0])


def test_layout_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"seq_len=20 is not divisible by 2 x cp = 8 .*use a multiple of 8"):
        SequenceLayout(20, 4)
    with pytest.raises(ValueError, match=r"dimension 1 of a tensor of shape \(1, 8\) is not the sequence \(16\)"):
        SequenceLayout(16, 2).shard(torch.zeros(1, 8), 0)


# -- ring attention vs SDPA on the whole sequence -------------------------------------------------


@pytest.mark.parametrize("rotate_method", ["allgather", "alltoall"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["balanced", "contiguous"])
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_sdpa_with_grouped_query_heads(cp, load_balance, rotate_method):
    q, k, v, grad_out = _qkv(batch=2, heads=4, kv_heads=2)
    results = run_on_ranks(cp, _ring_rank, q, k, v, grad_out, load_balance, rotate_method)
    _assert_close(_assemble(results, SequenceLayout(SEQ, cp, load_balance)), _reference(q, k, v, grad_out))


@pytest.mark.parametrize("rotate_method", ["allgather", "alltoall"])
def test_ring_attention_matches_sdpa_with_one_kv_head_per_query_head(rotate_method):
    q, k, v, grad_out = _qkv(batch=1, heads=2, kv_heads=2, seed=1)
    results = run_on_ranks(4, _ring_rank, q, k, v, grad_out, True, rotate_method)
    _assert_close(_assemble(results, SequenceLayout(SEQ, 4)), _reference(q, k, v, grad_out))


@pytest.mark.parametrize("rotate_method", ["allgather", "alltoall"])
def test_ring_attention_on_cp_sub_groups_of_a_2d_mesh(rotate_method):
    # (dp 2, cp 2): the cp peers of rank 2 are global ranks 2 and 3, not 0 and 1.
    q, k, v, grad_out = _qkv(batch=2, heads=4, kv_heads=1, seed=2)
    results = run_on_ranks(4, _ring_rank, q, k, v, grad_out, True, rotate_method, 2)
    _assert_close(_assemble(results, SequenceLayout(SEQ, 2), dp=2), _reference(q, k, v, grad_out))


def _bf16_rank(q, k, v, grad_out):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    layout = SequenceLayout(SEQ, mesh.size())
    local = [layout.shard(t, mesh.get_local_rank(), dim=2).bfloat16().requires_grad_() for t in (q, k, v)]
    out = RingAttention(mesh.get_group())(*local)
    out.backward(layout.shard(grad_out, mesh.get_local_rank(), dim=2).bfloat16())
    assert out.dtype == torch.bfloat16 and all(t.grad.dtype == torch.bfloat16 for t in local)
    return {"out": out.detach().float(), "grads": [t.grad.float() for t in local], "dp_rank": 0,
            "cp_rank": mesh.get_local_rank()}


def test_ring_attention_in_bf16_keeps_dtypes_and_stays_close():
    q, k, v, grad_out = _qkv(batch=1, heads=4, kv_heads=2, seed=3)
    got = _assemble(run_on_ranks(2, _bf16_rank, q, k, v, grad_out), SequenceLayout(SEQ, 2))
    for a, b in zip(got, _reference(q, k, v, grad_out)):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_ring_attention_rejects_bad_arguments():
    q = torch.zeros(1, 3, 8, 4)
    with pytest.raises(ValueError, match=r"rotate_method='ring' is not one of allgather, alltoall"):
        ring_attention(q, q, q, None, rotate_method="ring")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"h a multiple of h_kv; got q \(1, 3, 8, 4\), k \(1, 2, 8, 4\)"):
        ring_attention(q, torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), None)  # type: ignore[arg-type]


def test_attention_with_a_replaced_attention_fn_refuses_masks_and_caches():
    from kenotron.models.common.attention import GQAttention

    attention = GQAttention(dim=16, n_heads=4, n_kv_heads=2, head_dim=4)
    attention.attention_fn = RingAttention(group=None)  # type: ignore[arg-type]  # never reached
    x, cos = torch.zeros(1, 4, 16), torch.ones(4, 4)
    with pytest.raises(RuntimeError, match=r"attention_fn was replaced by RingAttention, which supports plain causal"):
        attention(x, cos, cos, attn_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool))


def _ring_warnings(q, k, v, grad_out):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ring_rank(q, k, v, grad_out, load_balance=True, rotate_method="allgather")
    return [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, FutureWarning)]


def test_ring_attention_raises_no_deprecation_warning_of_its_own():
    q, k, v, grad_out = _qkv(batch=1, heads=2, kv_heads=2)
    assert run_on_ranks(2, _ring_warnings, q, k, v, grad_out) == [[], []]
