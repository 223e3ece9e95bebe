"""All-to-all (Ulysses) context-parallel attention on CPU/gloo, against attention on the whole
sequence in one process.

Every rank gets its slice of q/k/v in the layout under test, runs ulysses_attention and
back-propagates its slice of a fixed output gradient; the slices are put back together and
compared with causal SDPA (or the whole sequence's document mask) in fp32: outputs and q/k/v
gradients within 1e-5. One pool call per world size runs every case (the cases are cheap, the
calls are not).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from kenotron.degrees import ulysses_head_problem
from kenotron.models.common.flex_attention import dense_mask, document_block_mask
from kenotron.parallel.context.layout import SequenceLayout
from kenotron.parallel.context.ulysses import UlyssesAttention, chunk_places, kv_repeats, ulysses_attention
from tests.distributed.pool import run_on_ranks

SEQ, HEAD_DIM = 32, 8
# Documents whose borders fall inside chunks (8 tokens a chunk under cp 2, 4 under cp 4).
DOCUMENTS = torch.tensor([[0] * 11 + [1] * 21, [0] * 3 + [1] * 17 + [2] * 12])


def _qkv(batch: int, heads: int, kv_heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads), (batch, kv_heads), (batch, kv_heads), (batch, heads)]
    return tuple(torch.randn(*s, SEQ, HEAD_DIM, generator=gen) for s in shapes)


def _reference(q, k, v, grad_out, documents: torch.Tensor | None):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    gqa = k.shape[1] != q.shape[1]
    if documents is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:
        mask = dense_mask(document_block_mask(documents))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    out.backward(grad_out)
    return [out.detach(), q.grad, k.grad, v.grad]


# name: (batch, heads, kv_heads, load_balance, documents, dp)
CASES = {
    "balanced": (2, 4, 2, True, False, 1),
    "contiguous": (2, 4, 4, False, False, 1),
    "kv_heads_repeated": (1, 4, 1, True, False, 1),  # one kv head shared by the cp ranks
    "documents": (2, 4, 2, True, True, 1),
    "document_ids": (2, 4, 2, True, "ids", 1),  # what the trainer hands the module: ids, mask built once
    "dp2_subgroups": (2, 4, 2, True, False, 2),  # cp groups {0, 1} and {2, 3} of a (dp 2, cp 2) mesh
    "flash_kernel": (2, 4, 2, True, "flash", 1),  # the layer's FlashAttention on the whole sequence of its heads
}


def _stand_in_flash(seen: list[tuple[int, ...]]):
    """A FlashAttention whose flash_attn_func is causal SDPA in flash-attn's (b, s, h, d) layout,
    recording the q shapes it is handed."""
    from kenotron.models.common.flash_attention import FlashAttention

    def func(q, k, v, causal):
        assert causal
        seen.append(tuple(q.shape))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                             enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)

    return FlashAttention(func, 4)


def _rank(case: str, cp_world: int) -> dict:
    """One case on this rank: its slices of out, dq, dk, dv (cp_world: ranks per cp group x dp)."""
    batch, heads, kv_heads, load_balance, with_documents, dp = CASES[case]
    q, k, v, grad_out = _qkv(batch, heads, kv_heads, seed=len(case))
    cp = cp_world // dp
    mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
    cp_rank, dp_rank = mesh["cp"].get_local_rank(), mesh["dp"].get_local_rank()
    rows = slice(dp_rank, dp_rank + 1) if dp > 1 else slice(None)
    layout = SequenceLayout(SEQ, cp, load_balance)
    local = [layout.shard(t[rows], cp_rank, dim=2).requires_grad_() for t in (q, k, v)]
    seen: list[tuple[int, ...]] = []
    if with_documents == "flash":
        out = UlyssesAttention(mesh["cp"].get_group(), load_balance, kernel=_stand_in_flash(seen))(*local)
    elif with_documents == "ids":
        documents = SimpleNamespace(ids=DOCUMENTS[rows], cache={})
        module = UlyssesAttention(mesh["cp"].get_group(), load_balance)
        out = module(*local, documents)
        built = documents.cache["ulysses_block_mask"]
        module(*(t.detach() for t in local), documents)  # a second layer of the same micro-batch
        assert documents.cache["ulysses_block_mask"] is built
    else:
        mask = document_block_mask(DOCUMENTS[rows]) if with_documents else None
        out = ulysses_attention(*local, mesh["cp"].get_group(), load_balance=load_balance, block_mask=mask)
    out.backward(layout.shard(grad_out[rows], cp_rank, dim=2))
    return {"parts": [out.detach(), *(t.grad for t in local)], "dp_rank": dp_rank, "cp_rank": cp_rank, "seen": seen}


def _cases_on(world: int) -> list[str]:
    """The cases `world` ranks run: every one on 4 ranks (cp 4, or dp 2 x cp 2), those without dp on 2."""
    return [case for case in CASES if world == 4 or CASES[case][5] == 1]


def _all_cases(world: int) -> dict[str, dict]:
    return {case: _rank(case, world) for case in _cases_on(world)}


@pytest.fixture(scope="module")
def results_on():
    """Each world size's pool call, made once for all of its cases."""
    done: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in done:
            done[world] = run_on_ranks(world, _all_cases, world)
        return done[world]

    return get


@pytest.mark.parametrize("world, case", [(w, c) for w in (2, 4) for c in _cases_on(w)])
def test_ulysses_attention_matches_whole_sequence_attention(world, case, results_on):
    results = results_on(world)
    batch, heads, kv_heads, load_balance, with_documents, dp = CASES[case]
    q, k, v, grad_out = _qkv(batch, heads, kv_heads, seed=len(case))
    want = _reference(q, k, v, grad_out, DOCUMENTS if with_documents not in (False, "flash") else None)
    if with_documents == "flash":  # the kernel ran once per rank, on the whole sequence of heads / cp
        assert all(r[case]["seen"] == [(batch, SEQ, heads // (world // dp), HEAD_DIM)] for r in results), results
    layout = SequenceLayout(SEQ, world // dp, load_balance)
    per_rank = [r[case] for r in results]
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        rows = []
        for d in range(dp):
            shards = [r["parts"][i] for r in sorted(per_rank, key=lambda r: r["cp_rank"]) if r["dp_rank"] == d]
            rows.append(layout.unshard(shards, dim=2))
        torch.testing.assert_close(torch.cat(rows), want[i], atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_a_layer_kernel_other_than_sdpa_is_refused_under_a_ring():
    from kenotron.parallel.context.apply import context_parallel_attention
    from kenotron.parallel.model_layout import PlanError
    from kenotron.parallel.parallel_settings import ParallelSettings

    with pytest.raises(PlanError, match=r"runs under context parallel only as the all-to-all's kernel"):
        context_parallel_attention(None, ParallelSettings(cp_scheme="ring"), None, kernel=_stand_in_flash([]))


def test_chunk_places_name_the_rank_and_slot_of_every_chunk():
    # cp 2, head-tail: chunks 0 and 3 on rank 0, 1 and 2 on rank 1; each rank's head chunk first.
    assert chunk_places(SequenceLayout(16, 2)) == ((0, 0), (1, 0), (1, 1), (0, 1))
    assert chunk_places(SequenceLayout(16, 2, load_balance=False)) == ((0, 0), (1, 0))


def test_rank_order_and_sequence_order_are_inverse():
    from kenotron.parallel.context.ulysses import _to_ranks, _to_sequence

    layout = SequenceLayout(24, 3)
    x = torch.arange(2 * 2 * 24 * 1.0).view(2, 2, 24, 1)
    buffer = _to_ranks(x, chunk_places(layout), 3)
    for rank in range(3):  # block r holds rank r's tokens in its layout order
        torch.testing.assert_close(buffer[rank], layout.shard(x, rank, dim=2))
    torch.testing.assert_close(_to_sequence(buffer, chunk_places(layout)), x)


def test_head_problems_name_the_counts():
    assert ulysses_head_problem(8, 4, 4) == "" and kv_repeats(4, 4) == 1
    assert ulysses_head_problem(8, 2, 4) == "" and kv_repeats(2, 4) == 2
    assert "6 query heads per tensor-parallel rank do not divide by cp=4" in ulysses_head_problem(6, 2, 4)
    assert "3 key/value heads" in ulysses_head_problem(6, 3, 2)
