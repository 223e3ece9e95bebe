"""The MoE layer on CPU: dropless grouping, the router's options, the two expert kernels against a
per-token reference, and the load-balancing terms against their formulas (transformers' aux loss)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kenotron.models.common.experts import gather_rows, group_by_expert, sum_rows
from kenotron.models.common.moe import LocalDispatcher, MoE
from kenotron.models.common.moe_args import MoEArgs
from kenotron.models.common.router import TopKRouter


def _layer(seed: int = 0, dtype=torch.float64, **kw) -> MoE:
    torch.manual_seed(seed)
    args = MoEArgs(**{"n_experts": 6, "top_k": 2, "ffn_dim": 12, **kw})
    layer = MoE(16, args).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    layer.router.init_buffers()
    return layer


def reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: what the layer computes, written plainly."""
    r = layer.router
    scores = F.linear(x, r.gate.weight).double()
    scores = scores.softmax(-1) if r.score_func == "softmax" else scores.sigmoid()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        chosen = torch.topk(scores[t] + r.expert_bias, r.top_k).indices
        w = scores[t, chosen]
        if r.norm_topk:
            w = w / w.sum()
        w = w * r.route_scale
        for e, wt in zip(chosen.tolist(), w):
            h = F.linear(x[t], layer.experts.w13[e])
            gate, up = h.chunk(2)
            out[t] += wt.to(x.dtype) * F.linear(F.silu(gate) * up, layer.experts.w2[e])
    if layer.shared_experts is not None:
        shared = layer.shared_experts(x)
        if layer.shared_gate is not None:
            shared = torch.sigmoid(layer.shared_gate(x)) * shared
        out = out + shared
    return out


def test_grouping_puts_every_copy_once_in_aligned_contiguous_groups():
    ids = torch.tensor([3, 0, 3, 1, 3, 0, 2, 3])
    g = group_by_expert(ids, 5, k=2, align=4)
    assert g.rows == 24  # static: copies + groups * (align - 1) = 23, rounded up to a multiple of align
    assert g.rows % 4 == 0  # float8 reads the buffer transposed: the row count is aligned too
    assert g.counts.tolist() == [2, 1, 1, 4, 0]
    starts = [0] + g.offsets.tolist()[:-1]
    assert all(s % 4 == 0 for s in starts) and g.offsets[-1] == g.rows
    for copy, row in enumerate(g.dest_row.tolist()):
        e = ids[copy].item()
        assert starts[e] <= row < g.offsets[e].item()
        assert g.src_copy[row] == copy
    padding = set(range(g.rows)) - set(g.dest_row.tolist())
    assert all(g.src_copy[p] == 8 for p in padding)


def test_grouping_counts_the_groups_without_an_accumulating_index_put():
    # On CUDA an accumulating index_put (index_add_) sorts the ids and adds each run of equal ids
    # serially (docs/performance.md, "the one-rank grouping counts its groups by binary search").
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.name())
            return func(*args, **(kwargs or {}))

    ids = torch.tensor([3, 0, 3, 1, 3, 0, 2, 3])
    with Ops() as ops:
        g = group_by_expert(ids, 5, k=2, align=4)
    assert g.counts.tolist() == [2, 1, 1, 4, 0]
    assert not [name for name in ops.names if "index_add" in name or "index_put" in name], ops.names


def test_gather_and_sum_rows_are_each_others_adjoint():
    ids = torch.randint(0, 4, (10 * 3,))
    g = group_by_expert(ids, 4, k=3, align=4)
    x = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
    rows = gather_rows(x, g)
    assert (rows[g.src_copy == 30] == 0).all()  # padding rows
    torch.autograd.gradcheck(lambda t: gather_rows(t, g), (x,))
    y = torch.randn(g.rows, 5, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: sum_rows(t, g), (y,))


@pytest.mark.parametrize("options", [
    {},
    {"score_func": "sigmoid", "route_scale": 2.5},
    {"norm_topk": False, "shared_ffn_dim": 8, "shared_gate": True},
])
@pytest.mark.parametrize("kernel", ["for_loop", "grouped_mm"])
def test_layer_equals_the_token_by_token_reference(options, kernel):
    if kernel == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm missing")
    layer = _layer(**options, dtype=torch.float32)
    layer.experts.kernel = kernel
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).reshape(-1, 16), reference(layer, x.reshape(-1, 16)), rtol=1e-5, atol=1e-5)


def test_the_two_kernels_agree_to_fp32_rounding_in_values_and_gradients():
    # Different GEMM shapes (the grouped path pads each expert's rows) round differently: a few ulp.
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm missing")
    results = []
    for kernel in ("for_loop", "grouped_mm"):
        layer = _layer(dtype=torch.float32, shared_ffn_dim=8)
        layer.experts.kernel = kernel
        x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = layer(x)
        out.pow(2).sum().backward()
        results.append([out.detach(), x.grad, *(p.grad for p in layer.parameters())])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_one_rank_grouped_gemm_keeps_the_tokens_not_their_grouped_rows_for_backward():
    # The first product gathers the rows itself (experts.py's gather_grouped_mm) and keeps the layer's
    # input, which the router keeps anyway: top-2 of 6 experts on 10 tokens would keep 40 grouped rows.
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm missing")
    layer = _layer(dtype=torch.float32)
    layer.experts.kernel = "grouped_mm"
    x = torch.randn(10, 16, requires_grad=True)
    kept: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    grouped_rows = -(-(10 * 2 + 6 * 3) // 4) * 4  # each expert's group padded to 4 fp32 rows
    assert (10, 16) in kept and (grouped_rows, 16) not in kept, kept


def test_expert_bias_changes_the_choice_not_the_weights():
    layer = _layer(dtype=torch.float32)
    x = torch.randn(20, 16)
    plain = layer.router(x)
    layer.router.expert_bias[3] = 100.0  # expert 3 now always chosen
    biased = layer.router(x)
    assert (biased.experts == 3).any(-1).all()
    scores = F.linear(x, layer.router.gate.weight).softmax(-1)
    picked = scores.gather(-1, biased.experts)
    torch.testing.assert_close(biased.weights, picked / picked.sum(-1, keepdim=True))
    assert not torch.equal(plain.experts, biased.experts)


def test_aux_loss_is_transformers_load_balancing_loss_for_one_layer():
    pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    router = TopKRouter(16, 6, 2)
    router.init_buffers()
    router.balance.aux = 1.0
    x = torch.randn(40, 16)
    r = router(x)
    term = router.balance_term(r)
    expected = load_balancing_loss_func((r.logits,), 6, 2)
    torch.testing.assert_close(term, expected)
    torch.testing.assert_close(router.aux_sum, expected)
    torch.testing.assert_close(router.load, r.counts)


def test_z_loss_and_its_gradient_reach_the_router_through_the_layer_output():
    layer = _layer(dtype=torch.float64)
    layer.router.balance.z = 0.5
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    out = layer(x)
    out.sum().backward()
    with_term = layer.router.gate.weight.grad.clone()
    layer.zero_grad()
    layer.router.balance.z = 0.0
    logits = F.linear(x.reshape(-1, 16), layer.router.gate.weight)
    (layer(x).sum() + 0.5 * torch.logsumexp(logits, -1).pow(2).sum() / 10).backward()
    torch.testing.assert_close(with_term, layer.router.gate.weight.grad)


def test_router_buffers_stay_fp32_when_the_model_is_cast():
    layer = _layer(dtype=torch.float32).to(torch.bfloat16)
    assert layer.router.load.dtype == torch.float32 and layer.router.expert_bias.dtype == torch.float32
    assert layer.router.gate.weight.dtype == torch.bfloat16


def test_top_k_larger_than_the_expert_count_is_refused():
    with pytest.raises(ValueError, match="top_k=9 must lie in"):
        TopKRouter(16, 8, 9)


@pytest.mark.parametrize("selective", [False, True])
def test_activation_checkpointing_recomputes_without_counting_twice(selective):
    from kenotron.parallel.activation_checkpoint import checkpoint_module

    layer = _layer(dtype=torch.float32)
    layer.router.balance.aux = 0.1
    x = torch.randn(2, 6, 16, requires_grad=True)
    layer(x).sum().backward()
    expected = [layer.router.load.clone(), layer.router.aux_sum.clone()] + [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    layer.router.reset_statistics()
    checkpoint_module(layer, selective=selective)
    layer(x).sum().backward()
    got = [layer.router.load, layer.router.aux_sum] + [p.grad for p in layer.parameters()]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


class _DispatcherWithGraphBreak:
    """The local dispatcher behind a graph break, as a compiled block meets the experts when they are
    FSDP units of their own (expert parallel, or the experts' bf16 reduction: parallel/plan.py)."""

    def __call__(self, x, r, experts):
        torch._dynamo.graph_break()
        return LocalDispatcher()(x, r, experts)


def _balance_gradient_of_the_gate(layer: MoE, x: torch.Tensor, compiled: bool) -> torch.Tensor:
    """d(balancing terms)/d(gate): the gate's gradient with the auxiliary loss and z-loss on, less
    the one with them off (the same routing, the same experts)."""
    grads = []
    for weight in (1.0, 0.0):
        layer.zero_grad()
        layer.router.balance.aux = layer.router.balance.z = weight
        run = torch.compile(layer, backend="aot_eager") if compiled else layer
        run(x).sum().backward()
        grads.append(layer.router.gate.weight.grad.clone())
    return grads[0] - grads[1]


def test_the_balancing_losses_reach_the_router_across_a_graph_break_at_the_experts():
    # attach_loss's forward did not read the term, and the compiled backward gave it no gradient:
    # no balancing at all (2026-11-27: compiled Qwen3-MoE under FSDP 2 with bf16 expert reduction,
    # whose blocks break their graphs at the experts, ran with an auxiliary loss 60% above the
    # fp32 run's after 100 steps, docs/performance.md run 121).
    layer = _layer(dtype=torch.float32)
    layer.dispatcher = _DispatcherWithGraphBreak()
    x = torch.randn(2, 5, 16)
    torch._dynamo.reset()
    eager = _balance_gradient_of_the_gate(layer, x, compiled=False)
    compiled = _balance_gradient_of_the_gate(layer, x, compiled=True)
    assert eager.abs().max() > 0
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-7)
