"""Triton kernels of the fused loss (kenotron/train/fused_loss.py): `cross_entropy_grad_`, a
chunk's loss with its gradient written over the logits (described at the kernel), and
`scale_to`, the backward's out = x · scale computed in fp32 and rounded once to the output dtype
(`scale` a 0-dim fp32 tensor on the device: the loss's gradient).

With bf16 weights (master weights, or FSDP's unsharded bf16 parameters) the output layer's weight
gradient is a (vocab, dim) bf16 product, and PyTorch's ops scale it either in bf16 after rounding
the scale to bf16 (a mul with a 0-dim fp32 device tensor casts it to the bf16 common dtype) or
through an fp32 copy: widen, multiply in place, narrow — three passes over 6 bytes per element.
This kernel reads the bf16 product once and writes the
bf16 gradient once, with the fp32 product's value. Importing this module needs `triton`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _scale_kernel(x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(scale_ptr).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (x * s).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def scale_to(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous `dtype` tensor holding round(float32(x) · scale); x contiguous."""
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    if n:
        _scale_kernel[(triton.cdiv(n, BLOCK),)](x, scale.to(torch.float32), out, n, BLOCK=BLOCK, num_warps=8)
    return out


@triton.jit
def _cross_entropy_kernel(logits_ptr, labels_ptr, loss_ptr, V, stride, ignore_index, BLOCK_V: tl.constexpr):
    # One program per row (token): an online log-sum-exp over the vocabulary, then the row's
    # gradient exp(x - lse) - onehot written over its logits. The second pass walks the row
    # backwards, so it starts with the blocks the first pass read last (still in L2).
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    label = tl.load(labels_ptr + row)
    valid = label != ignore_index
    safe = tl.where(valid, label, 0)
    lanes = tl.arange(0, BLOCK_V)
    m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane that has seen no logit yet
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, 0)
    lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max), 0))
    target = tl.load(base + safe).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - target, 0.0))
    last = ((V - 1) // BLOCK_V) * BLOCK_V
    for i in range(0, V, BLOCK_V):
        offs = last - i + lanes
        mask = offs < V
        x = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.exp(x - lse) - tl.where(offs == safe, 1.0, 0.0)
        tl.store(base + offs, tl.where(valid, g, 0.0).to(logits_ptr.dtype.element_ty), mask=mask)


def cross_entropy_grad_(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, *, block_v: int = 2048,
                        num_warps: int = 8) -> torch.Tensor:
    """Sum over rows of CE(logits, labels) (fp32; rows labelled `ignore_index` count 0), and the
    gradient of that sum with respect to the logits written over them, in their dtype (zero
    rows for ignored labels). `logits` (tokens, vocab) with unit stride along the vocabulary.
    `block_v`, `num_warps`: the launch (`python scripts/bench_loss.py --ce-sweep` times them)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError(f"cross_entropy_grad_ needs logits with unit stride along the vocabulary, got {logits.stride()}")
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _cross_entropy_kernel[(rows,)](logits, labels, losses, vocab, logits.stride(0), ignore_index,
                                       BLOCK_V=block_v, num_warps=num_warps)
    return losses.sum()
