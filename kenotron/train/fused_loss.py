"""Output projection + cross-entropy in chunks, never holding full-vocabulary logits.

With a 128k vocabulary, the logits of a 4 x 4096-token batch are 2.1 G values: 4 GB in bf16,
8 GB in fp32, and as much again for their gradient. `linear_cross_entropy_sum` walks the
tokens in chunks: for each chunk it computes the logits, the loss and, right away, the
gradient of the loss with respect to the chunk's hidden states and to the weight (the loss
is the graph's end, so its gradient is known up to the incoming scale). Only those two
gradients are kept for backward, which just scales them. Matmul FLOPs are the same as the
plain path (forward, and the two backward products); the fp32 logits of one chunk are the
largest temporary.

Numerics: logits are computed in the matmul dtype (bf16 under mixed precision, like the
plain path's output layer); softmax and log-softmax accumulate in fp32 inside their kernels;
the gradient is in the matmul dtype for the two products (as autocast's backward uses); the
weight gradient accumulates in fp32 across chunks (with one chunk, the default for b4 x 4096,
the product is kept in the matmul dtype and widened once in backward: the same values).
Backward multiplies both gradients by the incoming scale (1 / tokens) in fp32 and rounds once
to the parameter's and the hidden states' dtype; on CUDA in one Triton pass each.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from kenotron.kernel_choice.tuning import triton_importable
from kenotron.train.loss import IGNORE_INDEX


def _chunk_loss_and_grad(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of CE over the chunk (fp32), and d(sum)/d(logits) in h's dtype.

    Works on logits in the matmul dtype: softmax and log-softmax accumulate in fp32 inside
    their kernels, so no fp32 copy of the chunk's logits is made (in bf16 that halves the
    memory traffic of this step). Per-token losses are rounded to the matmul dtype before
    the fp32 sum; rounding to nearest is unbiased, so the sum over thousands of tokens keeps
    a relative error far below the dtype's epsilon. Rows of ignored labels are zeroed later,
    in the [tokens, dim] products, not here.
    """
    logits = h @ w.t()
    safe = torch.where(labels != IGNORE_INDEX, labels, 0)
    token_loss = torch.nn.functional.cross_entropy(logits, safe, reduction="none")
    loss = (token_loss.float() * (labels != IGNORE_INDEX)).sum()
    grad = torch.softmax(logits, dim=-1)
    grad.scatter_add_(1, safe[:, None], torch.full((safe.shape[0], 1), -1.0, dtype=grad.dtype, device=grad.device))
    return loss, grad


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk_tokens, chunk_fn, compute_dtype):
        h2 = h.reshape(-1, h.shape[-1])
        flat_labels = labels.reshape(-1)
        w = weight.to(compute_dtype)
        hc = h2.to(compute_dtype)
        grad_h = torch.empty_like(hc)
        grad_w = None
        single_chunk = hc.shape[0] <= chunk_tokens
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, hc.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, hc.shape[0])
            labels_c = flat_labels[start:stop]
            chunk_loss, g = chunk_fn(hc[start:stop], w, labels_c)
            loss += chunk_loss
            keep = (labels_c != IGNORE_INDEX)[:, None].to(hc.dtype)
            grad_h[start:stop] = (g @ w) * keep
            part = g.t() @ (hc[start:stop] * keep)
            grad_w = add_weight_part(grad_w, part, single_chunk)
        save_gradients(ctx, grad_h, grad_w, h, weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        return *scaled_gradients(ctx, grad_loss), None, None, None, None


def add_weight_part(grad_w: torch.Tensor | None, part: torch.Tensor, single_chunk: bool) -> torch.Tensor:
    """The weight's gradient so far with one chunk's product `part` added. With one chunk the
    product is kept in the matmul dtype until backward, which widens it once: the same values as
    accumulating one term in fp32, without a zero-filled fp32 buffer, a cast and an add over the
    whole (vocab, dim) matrix (measured: docs/performance.md). Several chunks accumulate in fp32,
    reading each chunk's product as it is."""
    if single_chunk:
        return part
    if grad_w is None:
        return part.to(torch.promote_types(part.dtype, torch.float32))
    return grad_w.add_(part)


def save_gradients(ctx, grad_h: torch.Tensor, grad_w: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> None:
    """Keep the gradients computed in forward for `scaled_gradients`, with the shape and dtypes of
    the hidden states and the weight they are returned in."""
    ctx.save_for_backward(grad_h, grad_w)
    ctx.h_shape, ctx.h_dtype, ctx.w_dtype = h.shape, h.dtype, weight.dtype


def scaled_gradients(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The saved (hidden states, weight) gradients times the incoming scale, in their own dtypes."""
    grad_h, grad_w = ctx.saved_tensors
    return (_scaled(grad_h, grad_loss, ctx.h_dtype).reshape(ctx.h_shape),
            _scaled(grad_w, grad_loss, ctx.w_dtype))


def _scaled(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x · scale in fp32, rounded once to `dtype` (a new tensor: the saved one is never
    overwritten). On CUDA one Triton pass (kenotron/kernels/loss.py), else through fp32."""
    if torch._subclasses.fake_tensor.is_fake(x) and not isinstance(x, DTensor):
        return torch.empty_like(x, dtype=dtype)  # the estimator plans a CUDA job: the kernel's one allocation
    if x.is_cuda and not isinstance(x, DTensor) and x.is_contiguous() and triton_importable():
        # Importing it imports triton: only on CUDA.
        from kenotron.kernels.loss import scale_to

        return scale_to(x, scale, dtype)
    return (x.to(torch.promote_types(x.dtype, torch.float32)) * scale).to(dtype)


def linear_cross_entropy_sum(
    h: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int = 4096,
    compute_dtype: torch.dtype | None = None,
    chunk_fn: Callable | None = None,
) -> torch.Tensor:
    """sum(CE(h @ weight.T, labels)) over all tokens whose label is not IGNORE_INDEX.

    h: (..., dim) hidden states after the final norm; weight: (vocab, dim). `compute_dtype`
    is the matmul dtype (default: h's); `chunk_fn` may be a compiled `_chunk_loss_and_grad`.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    dtype = compute_dtype or h.dtype
    return _LinearCrossEntropy.apply(h, weight, labels, chunk_tokens, chunk_fn or _chunk_loss_and_grad, dtype)


def _chunk_loss_and_grad_for_compile(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as `_chunk_loss_and_grad`, written for the compiler.

    Written as explicit fp32 math (log-sum-exp, target logit, exp(logit - lse) - one-hot,
    masked rows) so that Inductor fuses it into one row-reduction kernel that reads the logits
    and writes the gradient, with no fp32 copy and no softmax / scatter passes (into a buffer
    of its own; its peak memory: docs/performance.md). Eagerly this form
    would materialise fp32 copies of the logits, hence the separate eager function.
    """
    logits = h @ w.t()
    valid = labels != IGNORE_INDEX
    safe = torch.where(valid, labels, 0)
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    target = torch.gather(lf, 1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - target, 0.0).sum()
    vocab = torch.arange(logits.shape[1], device=logits.device)
    one_hot = (vocab[None, :] == safe[:, None]).float()
    grad = (torch.exp(lf - lse[:, None]) - one_hot) * valid[:, None]
    return loss, grad.to(logits.dtype)


def compiled_chunk_fn() -> Callable:
    """The per-chunk step compiled: one reduction and one pointwise kernel over the logits."""
    return torch.compile(_chunk_loss_and_grad_for_compile, dynamic=False)


def _triton_chunk_loss_and_grad(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as `_chunk_loss_and_grad_for_compile`, by one Triton kernel that reads each
    row of logits twice and writes its gradient over it (kenotron/kernels/loss.py)."""
    logits = h @ w.t()
    if isinstance(logits, DTensor):  # a kernel over local memory; DTensors take PyTorch's ops
        return _chunk_loss_and_grad(h, w, labels)
    if torch._subclasses.fake_tensor.is_fake(logits):  # the estimator: the kernel's allocations
        return torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device).sum(), logits
    # Importing it imports triton: only on CUDA.
    from kenotron.kernels.loss import cross_entropy_grad_

    return cross_entropy_grad_(logits, labels, IGNORE_INDEX), logits


def chunk_fn_for(kernel: str) -> Callable | None:
    """The chunk step of a `tuning.loss_kernel` resolved by kenotron.kernel_choice.tuning.resolve_loss_kernel
    (None: the PyTorch-ops default)."""
    if kernel == "triton":
        return _triton_chunk_loss_and_grad
    return compiled_chunk_fn() if kernel == "compiled" else None
