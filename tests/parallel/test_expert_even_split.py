"""parallel/expert_even_split.py: the expert-parallel exchange without a host read equals the
deduplicated (host-read) exchange and one rank holding every expert, in values and gradients,
on balanced and on fully skewed routing; its grouped buffer holds the worst case, but the
experts keep the received rows for backward, not the gathered ones (eager and compiled); it
runs on fake tensors (nothing data-dependent is read on the host) and, on a GPU, under
torch.cuda.set_sync_debug_mode("error")."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from kenotron.models.common.experts import GroupedExperts, gather_rows, grouped_mm, sum_rows
from kenotron.models.common.moe import LocalDispatcher, MoE
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.router import RouterOutput
from kenotron.parallel.expert import UnevenSplitDispatcher
from kenotron.parallel.expert_even_split import (
    EvenSplitDispatcher,
    even_split_grouping,
    pays_without_host_read,
    static_rows,
)
from tests.distributed.pool import run_on_ranks

DIM, FFN = 16, 24  # multiples of 8: rows 16-byte aligned for torch._grouped_mm (bf16 in the fake-tensor test)


def _routing(tokens: int, n_experts: int, top_k: int, skewed: bool) -> RouterOutput:
    """Distinct top-k experts per token and their weights; `skewed`: every token to the first
    top_k experts (all on rank 0)."""
    scores = torch.rand(tokens, n_experts)
    if skewed:
        scores[:, :top_k] += 2.0
    weights, ids = torch.rand(tokens, top_k), scores.topk(top_k, dim=1).indices
    return RouterOutput(weights, ids, torch.empty(0), torch.empty(0), torch.empty(0))


def _experts(n_experts: int, kernel: str, w13: torch.Tensor, w2: torch.Tensor,
             gather_first: bool = False) -> GroupedExperts:
    """`gather_first`: the grouped rows are gathered before the first product and kept for its
    weight gradient, as before the fused gather (any product but the plain one takes that path)."""
    experts = GroupedExperts(DIM, FFN, n_experts)
    experts.kernel = kernel
    experts.w13, experts.w2 = nn.Parameter(w13.clone()), nn.Parameter(w2.clone())
    if gather_first:
        experts.grouped_mm = lambda x, w_t, offsets: grouped_mm(x, w_t, offsets)
    return experts


def _run(dispatch, x: torch.Tensor, r: RouterOutput, experts: GroupedExperts, grad_out: torch.Tensor) -> dict:
    x = x.clone().requires_grad_()
    weights = r.weights.clone().requires_grad_()
    y = dispatch(x, RouterOutput(weights, r.experts, r.logits, r.probs, r.counts), experts)
    (y * grad_out).sum().backward()
    return {"y": y.detach(), "x": x.grad, "weights": weights.grad, "w13": experts.w13.grad, "w2": experts.w2.grad}


def _three_ways(kernel: str, tokens: int, n_experts: int, top_k: int, skewed: bool) -> dict[str, dict]:
    """On each rank: its tokens' outputs and gradients, and its experts' gradients, from the even
    split, the deduplicated exchange and one rank computing every rank's tokens."""
    ep, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)  # every rank draws every rank's tokens
    x = torch.randn(ep * tokens, DIM)
    r = _routing(ep * tokens, n_experts, top_k, skewed)
    w13, w2 = torch.randn(n_experts, 2 * FFN, DIM) * 0.3, torch.randn(n_experts, DIM, FFN) * 0.3
    grad_out = torch.randn(ep * tokens, DIM)
    whole = _run(LocalDispatcher(), x, r, _experts(n_experts, kernel, w13, w2), grad_out)
    local, mine = n_experts // ep, slice(rank * tokens, (rank + 1) * tokens)
    experts_here = slice(rank * local, (rank + 1) * local)
    reference = {"y": whole["y"][mine], "x": whole["x"][mine], "weights": whole["weights"][mine],
                 "w13": whole["w13"][experts_here], "w2": whole["w2"][experts_here]}
    r_mine = RouterOutput(r.weights[mine], r.experts[mine], r.logits, r.probs, r.counts)
    out = {"one rank": reference}
    for name, dispatcher, gather_first in (("even", EvenSplitDispatcher, False),
                                           ("even, gathered first", EvenSplitDispatcher, True),
                                           ("uneven", UnevenSplitDispatcher, False)):
        experts = _experts(n_experts, kernel, w13[experts_here], w2[experts_here], gather_first)
        out[name] = _run(dispatcher(dist.group.WORLD, ep), x[mine], r_mine, experts, grad_out[mine])
    return out


@pytest.mark.parametrize("world,kernel,skewed", [(2, "for_loop", False), (2, "grouped_mm", False),
                                                 (4, "grouped_mm", False), (4, "grouped_mm", True)],
                         ids=["ep2-for-loop", "ep2-grouped-mm", "ep4-grouped-mm", "ep4-every-token-on-rank-0"])
def test_even_split_equals_the_deduplicated_exchange_and_one_rank(world, kernel, skewed):
    for rank_out in run_on_ranks(world, _three_ways, kernel, 6, 8, 2, skewed):
        for key, reference in rank_out["one rank"].items():
            torch.testing.assert_close(rank_out["even"][key], reference, rtol=1e-5, atol=1e-6, msg=key)
            # Same rows through the same experts, summed over the ranks in the same order; the
            # fused gather runs torch's own _grouped_mm derivative on the rows gathered again.
            for other in ("uneven", "even, gathered first"):
                torch.testing.assert_close(rank_out["even"][key], rank_out[other][key], rtol=0, atol=0, msg=key)


def _kept_for_backward(step, *args) -> dict[int, tuple[int, tuple[int, ...]]]:
    """The distinct storages that autograd keeps for backward while step(*args) runs: their
    bytes and the shape of a tensor kept on each."""
    storages: dict[int, tuple[int, tuple[int, ...]]] = {}

    def count(t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # the all-to-all's result: its inner tensors hold the bytes
            for name in t.__tensor_flatten__()[0]:
                count(getattr(t, name))
        else:
            storages[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))

    def pack(t: torch.Tensor) -> torch.Tensor:
        count(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(*args)
    return storages


def _bytes_kept_for_backward(step, *args) -> int:
    return sum(nbytes for nbytes, _ in _kept_for_backward(step, *args).values())


def _even_split_saved_bytes(tokens: int, n_experts: int, top_k: int) -> dict[str, int]:
    """One even-split layer (fp32, "grouped_mm"): the bytes it keeps for backward with the fused
    gather and gathering first, and the sizes the difference is owed to."""
    ep, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(rank)
    x, r = torch.randn(tokens, DIM, requires_grad=True), _routing(tokens, n_experts, top_k, skewed=False)
    local = n_experts // ep
    w13, w2 = torch.randn(local, 2 * FFN, DIM), torch.randn(local, DIM, FFN)
    saved = {}
    for name, gather_first in (("fused", False), ("gathered first", True)):
        experts = _experts(n_experts, "grouped_mm", w13, w2, gather_first)
        saved[name] = _bytes_kept_for_backward(EvenSplitDispatcher(dist.group.WORLD, ep), x, r, experts)
    saved["grouped rows"] = static_rows(ep * tokens, top_k, local, 16 // x.element_size())
    return saved


def test_even_split_keeps_the_received_rows_not_the_grouped_rows_for_backward():
    tokens, ep = 6, 2
    for saved in run_on_ranks(ep, _even_split_saved_bytes, tokens, 8, 2):
        fewer_rows = saved["grouped rows"] - ep * tokens  # 40 grouped rows (top-2 of 4 local, padded) vs 12 received
        assert saved["gathered first"] - saved["fused"] >= fewer_rows * DIM * 4, saved


def _even_split_experts_step(g, fused: bool, compiled: bool) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
    """The experts of the even split on grouping `g` (bf16: _grouped_mm's fake kernel takes no
    other dtype): the output and the gradients, and the shapes of the tensors kept for backward."""
    torch.manual_seed(1)
    experts = _experts(4, "grouped_mm", torch.randn(4, 2 * FFN, DIM), torch.randn(4, DIM, FFN), not fused).bfloat16()
    x = torch.randn(g.copies // g.k, DIM, dtype=torch.bfloat16, requires_grad=True)
    scale = torch.rand(g.rows)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return sum_rows(experts(x, g.offsets, g.counts, scale, gather=g), g)

    # aot_eager: Dynamo and AOTAutograd's partitioner choose what is kept, as on the GPU rows
    # (inductor's code generation would take long on two CPU cores).
    step = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    out: list[torch.Tensor] = []
    kept = _kept_for_backward(lambda: out.append(step(x)))
    out[0].float().pow(2).sum().backward()
    return [out[0], x.grad, experts.w13.grad, experts.w2.grad], [shape for _, shape in kept.values()]


def test_even_split_experts_compiled_equal_eager_and_keep_the_received_rows():
    torch.manual_seed(0)
    g = even_split_grouping(torch.randint(0, 5, (12, 2)), local=4, align=8)  # id 4: another rank's expert
    gathered_first, _ = _even_split_experts_step(g, fused=False, compiled=False)
    compiled, kept = _even_split_experts_step(g, fused=True, compiled=True)
    for a, b in zip(compiled, gathered_first):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The partitioner chooses what the compiled graph keeps: had it traced backward's gather as a
    # copy of forward's (an autograd.Function), it would keep the 56 gathered rows, not the 12 received.
    assert (12, DIM) in kept and (g.rows, DIM) not in kept, kept


def test_grouping_of_received_rows_pads_each_expert_and_shares_one_zero_row():
    # 4 received rows, top-2; local experts 0..1, id 2 = an expert of another rank.
    local_ids = torch.tensor([[0, 2], [1, 0], [2, 1], [2, 2]])
    g = even_split_grouping(local_ids, local=2, align=4)
    assert g.rows == static_rows(4, 2, 2, 4) == 16  # every slot local could be: 8 + 2 x 3 padding + 1, aligned
    assert g.offsets.tolist() == [4, 9] and g.counts.tolist() == [2, 2]  # the zero row (8) ends the last group
    x = torch.arange(1.0, 5.0).unsqueeze(1)  # row r holds r + 1
    grouped = gather_rows(x, g)
    assert grouped[:9].squeeze(1).tolist() == [1.0, 2.0, 0.0, 0.0, 2.0, 3.0, 0.0, 0.0, 0.0]
    assert sum_rows(grouped, g).squeeze(1).tolist() == [1.0, 4.0, 3.0, 0.0]  # row 3: no expert here


def test_grouping_fits_every_slot_on_one_rank_without_padding():
    # align 1 (the per-expert loop): all slots local, the zero row still fits past them.
    local_ids = torch.tensor([[0, 1], [1, 0]])
    g = even_split_grouping(local_ids, local=2, align=1)
    assert g.rows == 5 and g.offsets.tolist() == [2, 5] and sorted(g.dest_row.tolist()) == [0, 1, 2, 3]


def test_even_split_is_chosen_where_the_rank_fill_is_high_and_ep_at_most_4():
    # Empty rows a token, (ep - 1) * (1 - fill): 0.003, 0.012 and 0.21 (the debug models) at ep 2.
    assert pays_without_host_read(128, 8, 2, False) and pays_without_host_read(64, 6, 2, False)
    assert pays_without_host_read(8, 2, 2, False)
    assert pays_without_host_read(128, 8, 4, False)  # Qwen3-30B-A3B at ep 4: 0.28, measured faster
    assert not pays_without_host_read(64, 6, 4, False)  # DeepSeek-V3 16B at ep 4: 0.49, measured slower
    assert not pays_without_host_read(128, 8, 8, False)  # 2.3, and 8x the experts' buffers
    assert not pays_without_host_read(8, 1, 2, False)  # top-1 over 2 ranks: half the rows would be empty
    assert not pays_without_host_read(128, 8, 2, True)  # float8 experts keep the deduplicated exchange


def _fake_forward_backward() -> list[int]:
    """The even split's forward and backward on fake tensors: any host read of a value raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    bf16 = torch.bfloat16  # torch._grouped_mm's fake kernel takes bf16
    with FakeTensorMode():
        tokens, n_experts, k = 6, 8, 2
        x = torch.randn(tokens, DIM, dtype=bf16, requires_grad=True)
        r = RouterOutput(torch.rand(tokens, k, requires_grad=True), torch.randint(0, n_experts, (tokens, k)),
                         torch.empty(0), torch.empty(0), torch.empty(0))
        local = n_experts // dist.get_world_size()
        experts = _experts(n_experts, "grouped_mm", torch.randn(local, 2 * FFN, DIM, dtype=bf16),
                           torch.randn(local, DIM, FFN, dtype=bf16))
        y = EvenSplitDispatcher(dist.group.WORLD, dist.get_world_size())(x, r, experts)
        y.sum().backward()
        return list(experts.w13.grad.shape)


def test_even_split_reads_nothing_on_the_host_in_forward_or_backward():
    assert run_on_ranks(2, _fake_forward_backward) == [[4, 2 * FFN, DIM]] * 2


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA GPU with torch._grouped_mm in bf16 (compute capability 9+)")
def test_moe_layer_on_the_even_split_runs_without_a_cuda_synchronization(tmp_path):
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        dim = 256
        moe = MoE(dim, MoEArgs(n_experts=16, top_k=4, ffn_dim=128)).cuda().bfloat16()
        for param in moe.parameters():
            nn.init.normal_(param, std=0.02)
        moe.experts.kernel = "grouped_mm"
        moe.dispatcher = EvenSplitDispatcher(dist.group.WORLD, 1)
        x = torch.randn(4, 128, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        moe(x).float().pow(2).sum().backward()  # warm-up: lazy initializations may synchronize
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:  # router, exchange, grouping, grouped GEMMs and combine, forward and backward
            moe(x).float().pow(2).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.isfinite(moe.experts.w13.grad).all() and torch.isfinite(x.grad).all()
    finally:
        dist.destroy_process_group()
