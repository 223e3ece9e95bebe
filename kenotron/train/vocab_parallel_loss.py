"""The fused chunked loss under tensor parallel: output projection + cross-entropy with the
vocabulary split over the tp ranks, never holding whole-vocabulary (nor whole local) logits.

Each tp rank holds rows [r·V/tp, (r+1)·V/tp) of the output weight (the "output" style's
Shard(0)) and the hidden states of all its tokens (the final norm's output, gathered along the
sequence under sequence parallel). Per token chunk it computes its local logits and, in forward
as train/fused_loss.py does on one device, the gradients:

    stats      = [log-sum-exp of the row over this shard, the target logit if this shard holds it]
    all-gather the chunk's stats over tp (one [2, chunk] fp32 collective per chunk)
    lse        = log-sum-exp over the ranks' values; target = their sum (one rank's is non-zero)
    loss      += Σ (lse − target) over the tokens whose label is not IGNORE_INDEX
    d(logits)  = exp(logits − lse) − one-hot(label in this shard)     (zero rows for ignored labels)
    grad_w    += d^T h        exact for this rank's rows
    grad_h     = d · w_local  a partial sum over the tp ranks

One all-gather of the per-shard log-sum-exps replaces the textbook's all-reduce of the row max,
then of the sum of exponentials, then of the target logit: the same values in one collective of
the same size, combined locally in a fixed order (every rank gets the same loss). The
collective is a functional one, traceable if the loss is ever compiled whole.

grad_h is reduced once over tp in backward, by DTensor: the hidden states enter as a Replicate
DTensor made local with `grad_placements=[Partial()]` (as parallel/tensor.py's "block_input"
style does), so autograd reduce-scatters the partial gradient back to the sequence shards under
sequence parallel and all-reduces it without. The weight enters through `to_local()`, so its
gradient comes back a Shard(0) DTensor like the weight (FSDP reduces its dp dim as usual).

The chunk step is a `VocabChunkStep`: PyTorch's ops (CPU, and what the estimator runs on fake
tensors), or the same math compiled by Inductor (a row reduction and a pointwise kernel over the
logits, which the pointwise kernel overwrites with their gradient; what CUDA runs: the one-device
Triton kernel needs the global log-sum-exp in the middle of its row pass, which lives on the
other ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from kenotron.train.fused_loss import add_weight_part, chunk_fn_for, save_gradients, scaled_gradients
from kenotron.train.loss import IGNORE_INDEX


def _widened(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or wider if it is (the stats accumulate in fp32 at least)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _local_stats(h: torch.Tensor, w: torch.Tensor, local_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's local logits (matmul dtype) and their [2, tokens] stats (fp32, or fp64 for fp64 logits): each row's
    log-sum-exp over this shard, and its target logit where this shard holds the label (else 0;
    `local_labels` is -1 there)."""
    if torch._subclasses.fake_tensor.is_fake(h):  # the estimator: the compiled kernels' outputs
        logits = h @ w.t()
        return logits, torch.empty((2, logits.shape[0]), dtype=torch.promote_types(logits.dtype, torch.float32),
                                   device=logits.device)
    return _local_stats_math(h, w, local_labels)


def _local_stats_math(h: torch.Tensor, w: torch.Tensor, local_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_local_stats` on real tensors (what Inductor compiles: the matmul, then one row reduction)."""
    logits = h @ w.t()
    lf = _widened(logits)
    lse = torch.logsumexp(lf, dim=-1)
    target = torch.gather(lf, 1, local_labels.clamp(min=0)[:, None]).squeeze(1)
    return logits, torch.stack([lse, torch.where(local_labels >= 0, target, 0.0)])


def _local_grad(logits: torch.Tensor, lse: torch.Tensor, local_labels: torch.Tensor) -> torch.Tensor:
    """exp(logits − lse) − one-hot(local label), in the logits' dtype. `lse` is +inf on the rows of
    ignored labels, whose gradient is then zero; `local_labels` is -1 where no one-hot falls here."""
    if torch._subclasses.fake_tensor.is_fake(logits):  # the estimator: the compiled kernel's output buffer
        return torch.empty_like(logits)
    grad = torch.exp(_widened(logits) - lse[:, None])
    here = (local_labels >= 0).to(grad.dtype)[:, None]
    grad.scatter_add_(1, local_labels.clamp(min=0)[:, None], -here)
    return grad.to(logits.dtype)


def _local_grad_for_compile(logits: torch.Tensor, lse: torch.Tensor, local_labels: torch.Tensor) -> torch.Tensor:
    """`_local_grad`'s values as one pointwise expression (the one-hot as a comparison), written
    over the logits, which the chunk step no longer needs: Inductor fuses it into one kernel that
    reads each logit and stores its gradient in its place (an input mutation), so the chunk holds
    one logits-sized buffer, not two (the one-device Triton kernel does the same)."""
    vocab = torch.arange(logits.shape[1], device=logits.device)
    one_hot = (vocab[None, :] == local_labels[:, None]).to(lse.dtype)
    return logits.copy_((torch.exp(_widened(logits) - lse[:, None]) - one_hot).to(logits.dtype))


def _grad_buffer_on_fake(logits: torch.Tensor, lse: torch.Tensor, local_labels: torch.Tensor) -> torch.Tensor:
    """What the compiled gradient step returns on the estimator's fake tensors: the logits' own
    buffer, which it writes the gradient over (no new allocation)."""
    return logits


@dataclass(frozen=True)
class VocabChunkStep:
    """The two local halves of a chunk step, around the chunk's collective."""

    stats: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """(h, w_local, local_labels) -> (logits, [2, tokens] fp32 per-shard log-sum-exp and target logit)."""
    grad: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    """(logits, global lse with +inf on ignored rows, local_labels) -> d(loss sum)/d(logits), which
    may be written over the logits (the compiled step does)."""


TORCH_STEP = VocabChunkStep(_local_stats, _local_grad)
"""PyTorch's ops (immutable: nothing is cached in it)."""


class _EagerOnFake:
    """A compiled function that runs `eager` on fake tensors (the estimator never compiles)."""

    def __init__(self, eager: Callable, compiled: Callable) -> None:
        self.eager, self.compiled = eager, compiled

    def __call__(self, *args: torch.Tensor):
        if torch._subclasses.fake_tensor.is_fake(args[0]):
            return self.eager(*args)
        return self.compiled(*args)


def compiled_vocab_chunk_step() -> VocabChunkStep:
    """The chunk step compiled by Inductor: the matmul and a row reduction, then one pointwise kernel
    that writes the gradient over the logits."""
    return VocabChunkStep(_EagerOnFake(_local_stats, torch.compile(_local_stats_math, dynamic=False)),
                          _EagerOnFake(_grad_buffer_on_fake, torch.compile(_local_grad_for_compile, dynamic=False)))


def vocab_chunk_step_for(kernel: str) -> VocabChunkStep:
    """The chunk step for a resolved `tuning.loss_kernel`: compiled for "triton" and "compiled"
    (see the module docstring), PyTorch's ops for "torch"."""
    return TORCH_STEP if kernel == "torch" else compiled_vocab_chunk_step()


def writes_gradient_over_logits(kernel: str, vocab_parallel: bool) -> bool:
    """Whether the fused loss's chunk step for a resolved `tuning.loss_kernel` (`loss_chunk_step_for`)
    writes each chunk's gradient over its logits instead of a second logits-sized buffer: the
    one-device Triton kernel, and this module's compiled step (every kernel but "torch")."""
    return kernel != "torch" if vocab_parallel else kernel == "triton"


def loss_chunk_step_for(kernel: str, vocab_parallel: bool) -> Callable | VocabChunkStep | None:
    """The fused loss's chunk step for a resolved `tuning.loss_kernel`: this module's under tensor
    parallel (`vocab_parallel`), else train/fused_loss.py's `chunk_fn_for` (None: PyTorch's ops)."""
    return vocab_chunk_step_for(kernel) if vocab_parallel else chunk_fn_for(kernel)


def _global_lse_and_target(stats: torch.Tensor, mesh: DeviceMesh) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's [2, tokens] stats gathered, combined into the row's log-sum-exp over the whole
    vocabulary and its target logit."""
    # all_gather_single is all_gather_tensor's newer name (torch 2.13 warns on the old one).
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    gathered = gather(stats, 0, mesh)
    if isinstance(gathered, funcol.AsyncCollectiveTensor):
        gathered = gathered.wait()
    per_rank = gathered.view(mesh.size(), 2, stats.shape[1])
    return torch.logsumexp(per_rank[:, 0], dim=0), per_rank[:, 1].sum(dim=0)


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w_local, labels, vocab_start, mesh, chunk_tokens, step, compute_dtype):
        hc = h.reshape(-1, h.shape[-1]).to(compute_dtype)
        w = w_local.to(compute_dtype)
        flat = labels.reshape(-1)
        valid = flat != IGNORE_INDEX
        local = flat - vocab_start
        local_labels = torch.where(valid & (local >= 0) & (local < w.shape[0]), local, -1)
        grad_h = torch.empty_like(hc)
        grad_w = None
        single_chunk = hc.shape[0] <= chunk_tokens
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, hc.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, hc.shape[0])
            local_c, valid_c = local_labels[start:stop], valid[start:stop]
            logits, stats = step.stats(hc[start:stop], w, local_c)
            lse, target = _global_lse_and_target(stats, mesh)
            loss += torch.where(valid_c, lse - target, 0.0).sum()
            g = step.grad(logits, torch.where(valid_c, lse, torch.inf), local_c)
            del logits  # the gradient is written over it, or (PyTorch's ops) replaces it before the next chunk's
            grad_h[start:stop] = g @ w
            part = g.t() @ hc[start:stop]
            grad_w = add_weight_part(grad_w, part, single_chunk)
        save_gradients(ctx, grad_h, grad_w, h, w_local)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        return *scaled_gradients(ctx, grad_loss), None, None, None, None, None, None


def whole_hidden_states(h: torch.Tensor, mesh: DeviceMesh, sequence_parallel: bool) -> torch.Tensor:
    """The final norm's output as one local tensor of all the tokens, whose gradient (a partial sum
    over tp) is reduced once in backward. `h` is a DTensor on the tp mesh (the sequence-parallel
    norm's output) or a local tensor: this rank's sequence shard under `sequence_parallel`, else
    the whole (replicated) hidden states."""
    if not isinstance(h, DTensor):
        h = DTensor.from_local(h, mesh, [Shard(1) if sequence_parallel else Replicate()], run_check=False)
    return h.redistribute(h.device_mesh, [Replicate()]).to_local(grad_placements=[Partial()])


def vocab_parallel_linear_cross_entropy_sum(
    h: torch.Tensor,
    weight: DTensor,
    labels: torch.Tensor,
    *,
    sequence_parallel: bool,
    chunk_tokens: int = 4096,
    compute_dtype: torch.dtype | None = None,
    step: VocabChunkStep | None = None,
) -> torch.Tensor:
    """sum(CE(h @ weight.T, labels)) over all tokens whose label is not IGNORE_INDEX, the same on
    every tp rank (a plain tensor), with `weight` (vocab, dim) a Shard(0) DTensor on the tp mesh.

    h: (batch, seq, dim) hidden states after the final norm (see `whole_hidden_states` for its
    layouts); labels: (batch, seq), all of the sequence. `compute_dtype` is the matmul dtype
    (default: h's); `step` the chunk step (default: PyTorch's ops).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    if not isinstance(weight, DTensor) or weight.device_mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
        where = (f"placements {tuple(weight.placements)} on a {weight.device_mesh.ndim}-D mesh"
                 if isinstance(weight, DTensor) else "a plain tensor")
        raise ValueError(f"the vocabulary-parallel loss needs the output weight as a Shard(0) DTensor on the tp mesh, "
                         f"got {where}; apply the plan's 'output' style (parallel/tensor.py) first")
    mesh = weight.device_mesh
    vocab, tp = weight.shape[0], mesh.size()
    if vocab % tp:
        raise ValueError(f"tp={tp} does not divide the vocabulary ({vocab} rows); pick a tp that divides it")
    whole = whole_hidden_states(h, mesh, sequence_parallel)
    dtype = compute_dtype or whole.dtype
    start = mesh.get_local_rank() * (vocab // tp)
    return _VocabParallelLinearCrossEntropy.apply(whole, weight.to_local(), labels, start, mesh, chunk_tokens,
                                                  step or TORCH_STEP, dtype)
