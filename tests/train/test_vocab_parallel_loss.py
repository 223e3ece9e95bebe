"""The vocabulary-parallel fused loss on 2 gloo ranks equals the plain loss on one, in value and
in the gradients of the output weight and of the hidden states, with and without sequence
parallel, over several chunks and with ignored labels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kenotron.train.loss import IGNORE_INDEX
from kenotron.train.vocab_parallel_loss import (
    TORCH_STEP,
    VocabChunkStep,
    _local_grad_for_compile,
    _local_stats,
    vocab_parallel_linear_cross_entropy_sum,
)
from tests.distributed.pool import run_on_ranks

BATCH, SEQ, DIM, VOCAB = 2, 8, 16, 24


def _problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    h = torch.randn(BATCH, SEQ, DIM, dtype=torch.float64)
    w = torch.randn(VOCAB, DIM, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels[0, :3] = IGNORE_INDEX
    labels[1, -1] = IGNORE_INDEX
    labels[1, 0] = VOCAB - 1  # the last row of the last shard
    return h, w, labels


def _plain(scale: float) -> tuple[float, torch.Tensor, torch.Tensor]:
    h, w, labels = _problem()
    h.requires_grad_(True)
    w.requires_grad_(True)
    loss = F.cross_entropy((h @ w.t()).flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)
    gh, gw = torch.autograd.grad(loss * scale, (h, w))
    return loss.item(), gh, gw


def _on_ranks(layout: str, chunk: int, compile_form: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, whole grad of h, whole grad of w) on this rank: h handed over as `layout`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    rank, tp = dist.get_rank(), dist.get_world_size()
    h, w, labels = _problem()
    weight = torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(0)]))
    sp = layout != "replicated local"
    if sp:
        piece = h.chunk(tp, dim=1)[rank].clone().requires_grad_(True)
        given = DTensor.from_local(piece, mesh, [Shard(1)]) if layout == "sequence DTensor" else piece
    else:
        piece = h.clone().requires_grad_(True)
        given = piece
    step = VocabChunkStep(_local_stats, _local_grad_for_compile) if compile_form else TORCH_STEP
    loss = vocab_parallel_linear_cross_entropy_sum(given, weight, labels, sequence_parallel=sp, chunk_tokens=chunk,
                                                   step=step)
    (loss * 0.7).backward()
    assert isinstance(weight.grad, DTensor) and tuple(weight.grad.placements) == (Shard(0),), weight.grad
    assert weight.grad.to_local().shape == (VOCAB // tp, DIM)
    gh = piece.grad
    if sp:  # each rank holds its sequence shard's gradient, already summed over tp
        parts = [torch.empty_like(gh) for _ in range(tp)]
        dist.all_gather(parts, gh.contiguous())
        gh = torch.cat(parts, dim=1)
    return loss.item(), gh, weight.grad.full_tensor()


@pytest.mark.parametrize("layout, chunk", [("sequence DTensor", 5), ("sequence local", 16), ("replicated local", 3)])
def test_two_rank_vocab_parallel_loss_equals_one_rank_plain_loss(layout, chunk):
    loss, gh, gw = _plain(0.7)
    for rank_loss, rank_gh, rank_gw in run_on_ranks(2, _on_ranks, layout, chunk, False):
        assert abs(rank_loss - loss) <= 1e-7 * abs(loss)  # summed in fp32
        torch.testing.assert_close(rank_gh, gh, rtol=1e-7, atol=1e-8)  # the fp32 loss scales them
        torch.testing.assert_close(rank_gw, gw, rtol=1e-7, atol=1e-8)  # the fp32 loss scales them


def test_compile_form_gradient_equals_plain_loss_on_two_ranks():
    """The pointwise form Inductor compiles (CUDA's chunk step), run eagerly."""
    loss, gh, gw = _plain(0.7)
    for rank_loss, rank_gh, rank_gw in run_on_ranks(2, _on_ranks, "sequence DTensor", 7, True):
        assert abs(rank_loss - loss) <= 1e-7 * abs(loss)  # summed in fp32
        torch.testing.assert_close(rank_gh, gh, rtol=1e-7, atol=1e-8)  # the fp32 loss scales them
        torch.testing.assert_close(rank_gw, gw, rtol=1e-7, atol=1e-8)  # the fp32 loss scales them


def test_plain_weight_is_refused_with_the_fix():
    h, w, labels = _problem()
    with pytest.raises(ValueError, match="needs the output weight as a Shard\\(0\\) DTensor on the tp mesh, got a plain"):
        vocab_parallel_linear_cross_entropy_sum(h, w, labels, sequence_parallel=False)


def test_compiled_chunk_step_equals_pytorch_ops():
    """CUDA's chunk step, compiled by Inductor (here for the CPU), gives PyTorch's ops' stats and gradient."""
    from kenotron.train.vocab_parallel_loss import compiled_vocab_chunk_step

    torch.manual_seed(0)
    h, w = torch.randn(12, DIM), torch.randn(VOCAB // 2, DIM)
    local = torch.randint(-1, VOCAB // 2, (12,))
    compiled = compiled_vocab_chunk_step()
    (logits, stats), (c_logits, c_stats) = TORCH_STEP.stats(h, w, local), compiled.stats(h, w, local)
    torch.testing.assert_close(c_stats, stats)
    lse = torch.where(local % 3 == 0, torch.inf, stats[0] + 0.5)  # ignored rows, and a global lse above the local
    expected = TORCH_STEP.grad(logits, lse, local)
    buffer = c_logits.data_ptr()
    grad = compiled.grad(c_logits, lse, local)
    torch.testing.assert_close(grad, expected)
    # Written over the logits: the chunk holds one logits-sized buffer, not two.
    assert grad.data_ptr() == buffer


def test_compiled_gradient_step_allocates_nothing_on_fake_tensors():
    """The estimator's view of the compiled step: the gradient is the logits' own buffer."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kenotron.train.vocab_parallel_loss import compiled_vocab_chunk_step

    with FakeTensorMode():
        logits, lse, local = torch.empty(12, VOCAB // 2), torch.empty(12), torch.zeros(12, dtype=torch.long)
        assert compiled_vocab_chunk_step().grad(logits, lse, local) is logits


def _loss_collectives(sequence_parallel: bool) -> dict[str, int]:
    """The collectives of one forward and backward of the loss over 3 chunks, by name."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    h, w, labels = _problem()
    weight = torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(0)]))
    piece = (h.chunk(2, dim=1)[dist.get_rank()] if sequence_parallel else h).clone().requires_grad_(True)
    given = DTensor.from_local(piece, mesh, [Shard(1)]) if sequence_parallel else piece
    mode = CommDebugMode()
    with mode:
        vocab_parallel_linear_cross_entropy_sum(given, weight, labels, sequence_parallel=sequence_parallel,
                                                chunk_tokens=6).backward()
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_loss_sends_one_gather_per_chunk_and_reduces_the_hidden_gradient_once(sequence_parallel):
    counts = run_on_ranks(2, _loss_collectives, sequence_parallel)[0]
    chunks = -(-BATCH * SEQ // 6)
    if sequence_parallel:  # the hidden states gathered, then each chunk's stats; one reduce-scatter back
        assert counts == {"all_gather_into_tensor": 1 + chunks, "reduce_scatter_tensor": 1}, counts
    else:
        assert counts == {"all_gather_into_tensor": chunks, "all_reduce": 1}, counts
