"""The all-to-all inside a ring: parallelism.cp_scheme='ulysses' with heads that split over only
part of cp (parallel/context/ulysses.py, "With a ring"), on CPU/gloo.

First the attention alone: cp 4 = all-to-all 2 x ring 2, each rank's slices of q/k/v in the
plain cp layout (SequenceLayout(seq, 4)), against attention on the whole sequence in one
process (fp32, outputs and q/k/v gradients within 1e-5), causal and with documents crossing
chunk and rank borders, head-tail and contiguous, kv heads split and repeated, with each of
the three rings inside (kenotron's; flex's and torch's, the CUDA ones, run on CPU). Then the
trainer's own path against one rank (tests/parallel/parity.py): a model whose 2 heads divide 2
but not 4, plain causal and document-masked, its parameters FSDP-sharded over the cp ranks.
Then which all-to-all degree the heads give (the refusal of none > 1: test_context_ulysses_parity.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from kenotron.degrees import ParallelDims, ulysses_degree
from kenotron.models.common.flex_attention import dense_mask, document_block_mask
from kenotron.parallel.context.apply import context_parallel_attention
from kenotron.parallel.context.documents import SequenceDocuments
from kenotron.parallel.context.layout import SequenceLayout
from kenotron.parallel.parallel_settings import ParallelSettings
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps, write_short_documents

SEQ, HEAD_DIM, CP, ULYSSES = 32, 8, 4, 2
# Borders inside chunks (4 tokens a chunk of 8) and across the ranks' shards.
DOCUMENTS = torch.tensor([[0] * 11 + [1] * 21, [0] * 3 + [1] * 17 + [2] * 12])

# name: (heads, kv_heads, load_balance, documents, the ring inside: tuning.cp_attention)
CASES = {
    "balanced": (2, 2, True, False, "ring"),
    "contiguous": (6, 2, False, False, "ring"),
    "kv_heads_repeated": (2, 1, True, False, "ring"),  # one kv head, repeated over the all-to-all pair
    "documents": (2, 2, True, True, "ring"),
    # The CUDA rings, on CPU: flex against the gathered keys/values (document masking's), and
    # torch's ring routed to the CPU flash kernel as tests/parallel/test_context_torch_ring.py does.
    "flex_documents": (2, 2, True, True, "flex"),
    "torch_ring": (2, 2, True, False, "torch"),
}


def _qkv(heads: int, kv_heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(2, heads), (2, kv_heads), (2, kv_heads), (2, heads)]
    return tuple(torch.randn(*s, SEQ, HEAD_DIM, generator=gen) for s in shapes)


def _reference(q, k, v, grad_out, documents: torch.Tensor | None) -> list[torch.Tensor]:
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    gqa = k.shape[1] != q.shape[1]
    if documents is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(document_block_mask(documents)),
                                             enable_gqa=gqa)
    out.backward(grad_out)
    return [out.detach(), q.grad, k.grad, v.grad]


@contextlib.contextmanager
def _torch_ring_on_cpu(enabled: bool) -> Iterator[Callable[[], None]]:
    """Yield `route`, which sends the CPU flash op into torch's ring: call it after building the
    TorchRingAttention (enabling torch's dispatcher resets the op handlers, test_context_torch_ring.py
    does the same). On exit torch's process-wide CP state is as it was: the worker runs other tests."""
    if not enabled:
        yield lambda: None
        return
    from torch.distributed.tensor import DTensor

    from kenotron.parallel.context.torch_ring import configure_torch_context_parallel, torch_cp_api
    from tests.parallel.test_context_torch_ring import CPU_FLASH, CPU_FLASH_BACKWARD, _cpu_backward, _cpu_forward

    dispatcher = DTensor._op_dispatcher
    handlers = dispatcher._custom_op_handlers

    def route() -> None:
        dispatcher._custom_op_handlers = {
            **dispatcher._custom_op_handlers, CPU_FLASH: _cpu_forward, CPU_FLASH_BACKWARD: _cpu_backward,
        }

    try:
        yield route
    finally:
        dispatcher._custom_op_handlers = handlers
        api = torch_cp_api()
        api._disable_context_parallel_dispatcher()
        configure_torch_context_parallel(True, "allgather")
        api._disable_context_parallel_dispatcher()


def _all_cases() -> dict:
    """Every case on this rank, through the plan's own module and the job's split of the cp mesh."""
    from kenotron.parallel.dims import build_device_meshes

    meshes = build_device_meshes(ParallelDims.from_degrees(CP, cp=CP), "cpu")
    cp_rank = meshes.coordinate("cp")
    out = {"cp_rank": cp_rank}
    inner = set()
    for case, (heads, kv_heads, load_balance, with_documents, ring) in CASES.items():
        settings = ParallelSettings(cp_scheme="ulysses", cp_ulysses_degree=ULYSSES, cp_attention=ring,
                                    cp_load_balance=load_balance)
        with _torch_ring_on_cpu(ring == "torch") as route:
            module = context_parallel_attention(meshes.get("cp"), settings, meshes.split_cp(ULYSSES))
            route()
            q, k, v, grad_out = _qkv(heads, kv_heads, seed=len(case))
            layout = SequenceLayout(SEQ, CP, load_balance)
            local = [layout.shard(t, cp_rank, dim=2).requires_grad_() for t in (q, k, v)]
            documents = SequenceDocuments(DOCUMENTS) if with_documents else None
            result = module(*local, documents)
            result.backward(layout.shard(grad_out, cp_rank, dim=2))
        out[case] = [result.detach(), *(t.grad for t in local)]
        inner.add(type(module.inner).__name__)
    out["inner"] = sorted(inner)
    out["split_once"] = meshes.split_cp(ULYSSES) is meshes.split_cp(ULYSSES)
    return out


@pytest.fixture(scope="module")
def attention_results() -> list[dict]:
    return sorted(run_on_ranks(CP, _all_cases), key=lambda r: r["cp_rank"])


@pytest.mark.parametrize("case", list(CASES))
def test_all_to_all_inside_a_ring_matches_whole_sequence_attention(case, attention_results):
    heads, kv_heads, load_balance, with_documents, _ = CASES[case]
    want = _reference(*_qkv(heads, kv_heads, seed=len(case)), DOCUMENTS if with_documents else None)
    layout = SequenceLayout(SEQ, CP, load_balance)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = layout.unshard([r[case][i] for r in attention_results], dim=2)
        torch.testing.assert_close(got, want[i], atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_the_split_runs_the_named_ring_inside_and_is_built_once(attention_results):
    assert all(r["inner"] == ["FlexContextAttention", "RingAttention", "TorchRingAttention"] for r in attention_results)
    assert all(r["split_once"] for r in attention_results)


def test_the_all_to_all_takes_the_largest_divisor_of_cp_the_heads_split_over():
    assert ulysses_degree(2, 2, 4) == 2 and ulysses_degree(6, 2, 4) == 2
    assert ulysses_degree(8, 4, 4) == 4  # all of cp: the all-to-all alone, as before
    assert ulysses_degree(4, 1, 8) == 4  # one kv head: repeated over the group
    assert ulysses_degree(3, 3, 4) == 1  # nothing to scatter: refused at resolve


# The trainer: 2 heads (head_dim 128) divide the all-to-all pair but not cp 4.
HEADS = ["--model.n_heads", "2", "--model.n_kv_heads", "1"]
CP4 = HEADS + ["--parallelism.cp_scheme", "ulysses", "--parallelism.cp", "4", "--training.local_batch_size", "8"]


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> list[str]:
    return write_short_documents(tmp_path_factory.mktemp("docs") / "short.jsonl")


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_trainer_with_all_to_all_inside_a_ring_matches_one_rank(documents, short_documents, tmp_path):
    data = short_documents if documents else []
    reference = run_steps(HEADS + data, str(tmp_path / "ref"), 2)
    results = run_on_ranks(CP, run_steps, CP4 + data, str(tmp_path / "cp"), 2)
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-5)
    # FSDP shards the parameters over the whole cp group (dp_shard_cp), split or not.
    assert all(r["dtensor_params"] for r in results)
    assert results[0]["local_shapes"]["layers.0.attention.wq.weight"][0] < 256


def _attention_fns(overrides: list[str], folder: str) -> list[str]:
    from kenotron.config import load_config
    from kenotron.train.trainer import Trainer

    trainer = Trainer(load_config(None, ["--model.n_layers", "2", "--training.seq_len", "32",
                                         "--job.dump_folder", folder] + overrides))
    names = sorted({f"{type(m.attention_fn).__name__}({m.attention_fn.extra_repr()})"
                    for part in trainer.job.model_parts for m in part.modules() if hasattr(m, "attention_fn")})
    trainer.close()
    return names


def test_trainer_puts_the_ring_inside_the_all_to_all_where_heads_split_over_part_of_cp(tmp_path):
    # Without this the parity above could be a plain ring's under another name.
    got = run_on_ranks(CP, _attention_fns, CP4, str(tmp_path))
    assert got == [["UlyssesAttention(all-to-all=2, load_balance=True, ring=RingAttention)"]] * CP
