"""Document masking under context parallel on CPU/gloo: each rank's attention equals the slice of
block-causal attention over the whole sequence, forward and backward.

Reference: SDPA on the whole sequence with the dense block-causal mask, in one process. The
documents cross chunk and rank borders (chunks of 4 tokens at cp 4) and leave query rows that see
no key of a chunk pair (their partial log-sum-exp is -inf) and pairs the mask empties (skipped).
Both CP attentions run: kenotron's ring (both rotations, both layouts) and the FlexAttention one
over gathered keys/values, whose CPU forward without gradients is flex_attention's own kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from kenotron.parallel.context import FlexContextAttention, RingAttention, SequenceDocuments, SequenceLayout
from kenotron.parallel.context.block_math import merge_partial, pair_forward
from kenotron.parallel.context.documents import masked_work
from tests.distributed.pool import run_on_ranks

SEQ, HEAD_DIM = 32, 8
# Row 0: borders inside chunks and across ranks; row 1: one document spanning all, then short ones.
LENGTHS = ([3, 9, 1, 11, 8], [21, 2, 2, 7])


def _documents() -> torch.Tensor:
    return torch.stack([torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in LENGTHS])


def _dense_mask(documents: torch.Tensor) -> torch.Tensor:
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    return (causal & (documents[:, :, None] == documents[:, None, :]))[:, None]


def _qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, SEQ, HEAD_DIM, generator=gen)
    k = torch.randn(2, 2, SEQ, HEAD_DIM, generator=gen)
    v = torch.randn(2, 2, SEQ, HEAD_DIM, generator=gen)
    return q, k, v, torch.randn(2, 4, SEQ, HEAD_DIM, generator=gen)


def _reference(q, k, v, grad_out, documents):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(documents), enable_gqa=True)
    out.backward(grad_out)
    return [out.detach(), q.grad, k.grad, v.grad]


def _cp_rank(q, k, v, grad_out, documents, kind: str, load_balance: bool, rotate_method: str = "allgather"):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    rank, layout = mesh.get_local_rank(), SequenceLayout(SEQ, mesh.size(), load_balance)
    if kind == "ring":
        attention = RingAttention(mesh.get_group(), load_balance, rotate_method)
    else:
        attention = FlexContextAttention(mesh.get_group(), load_balance)
    local = [layout.shard(t, rank, dim=2).requires_grad_() for t in (q, k, v)]
    out = attention(*local, SequenceDocuments(documents))
    out.backward(layout.shard(grad_out, rank, dim=2))
    with torch.no_grad():  # without gradients flex_attention's own CPU kernel runs
        forward_only = attention(*(t.detach() for t in local), SequenceDocuments(documents))
    return [out.detach(), *(t.grad for t in local), forward_only]


@pytest.mark.parametrize(
    "kind, cp, load_balance, rotate_method",
    [("ring", 2, True, "allgather"), ("ring", 4, True, "alltoall"), ("ring", 4, False, "allgather"),
     ("flex", 2, True, "allgather")],  # flex eager on CPU is the slow case: one layout, the head-tail one
)
def test_document_masked_cp_attention_equals_block_causal_attention_on_one_rank(kind, cp, load_balance, rotate_method):
    q, k, v, grad_out = _qkv()
    documents = _documents()
    results = run_on_ranks(cp, _cp_rank, q, k, v, grad_out, documents, kind, load_balance, rotate_method)
    layout = SequenceLayout(SEQ, cp, load_balance)
    got = [layout.unshard([r[i] for r in results], dim=2) for i in range(5)]
    want = _reference(q, k, v, grad_out, documents)
    for name, a, b in zip(("out", "dq", "dk", "dv", "out without grad"), got, [*want, want[0]]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_a_row_that_sees_no_key_of_a_pair_merges_without_nan():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 1, 3, 4, generator=gen) for _ in range(3))
    hidden = torch.tensor([[False] * 3, [True, False, False], [False] * 3])[None, None, None]
    o_hidden, lse_hidden = pair_forward(q, k, v, False, 0.5, hidden)
    assert torch.isneginf(lse_hidden[..., 0]).all() and (o_hidden[..., 0, :] == 0).all()
    o_seen, lse_seen = pair_forward(q, k, v, False, 0.5)
    out, lse = merge_partial(o_hidden, lse_hidden, o_seen, lse_seen)
    assert not out.isnan().any()
    torch.testing.assert_close(out[..., 0, :], o_seen[..., 0, :])  # row 0 saw only the second pair
    torch.testing.assert_close(lse[..., 0], lse_seen[..., 0])
    both_hidden, total = merge_partial(o_hidden, lse_hidden, o_hidden, lse_hidden)
    assert torch.isneginf(total[..., 0]).all() and (both_hidden[..., 0, :] == 0).all()


def test_masked_work_counts_what_the_document_mask_leaves_by_brute_force():
    documents = _documents()
    layout = SequenceLayout(SEQ, 4)
    work = masked_work(documents, layout, block=4)
    allowed = _dense_mask(documents)[:, 0]
    assert work.causal_pairs == 2 * SEQ * (SEQ + 1) // 2
    assert work.document_pairs == int(allowed.sum())
    tiles = allowed.view(2, 8, 4, 8, 4).any(dim=(2, 4))  # chunks and tiles are both 4 tokens here
    assert work.chunk_pairs == work.causal_blocks == 2 * 8 * 9 // 2
    assert work.chunk_pairs_kept == work.document_blocks == int(tiles.sum())
    assert 0 < work.kept_fraction < 1
    one_document = masked_work(torch.zeros(1, SEQ, dtype=torch.int32), layout, block=4)
    assert one_document.kept_fraction == 1.0 and one_document.document_pairs == one_document.causal_pairs


def test_cp_attention_refuses_a_block_mask_of_the_whole_sequence_with_the_fix():
    from kenotron.models.common.flex_attention import causal_block_mask

    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(TypeError, match=r"not a BlockMask; build them with BlockMasks.documents\(whole_inputs\)"):
        RingAttention(group=None)(q, q, q, causal_block_mask(16, "cpu"))  # type: ignore[arg-type]
