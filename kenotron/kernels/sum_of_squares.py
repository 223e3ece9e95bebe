"""Sum of squares of many tensors in fp32, by one Triton kernel per tensor (the gradient norm on CUDA).

The gradient norm reads every gradient once, a memory-bound pass that torch's multi-tensor
`_foreach_norm` runs below the GPU's bandwidth (docs/performance.md); this kernel reads each tensor in
blocks of 8192 elements, squares and sums them in fp32 and writes one partial sum per block,
and one `sum` adds the partials. The partition is fixed by the sizes, so the result is the
same from run to run (no atomics).

Importing this module needs the `triton` package; the kernel needs CUDA (or Triton's CPU
interpreter, TRITON_INTERPRET=1, which the tests use).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 8192


@triton.jit
def _block_sum_of_squares_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(x * x, 0))


def sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sum over tensors of sum(t.float() ** 2), a 0-dim fp32 tensor on their device; contiguous
    tensors of any float dtype."""
    device = tensors[0].device
    blocks = [triton.cdiv(t.numel(), BLOCK) for t in tensors]
    partials = torch.empty(sum(blocks), dtype=torch.float32, device=device)
    start = 0
    for t, count in zip(tensors, blocks, strict=True):
        if count:
            if not t.is_contiguous():
                raise ValueError(f"sum_of_squares needs contiguous tensors, got strides {t.stride()}")
            _block_sum_of_squares_kernel[(count,)](t, partials[start:], t.numel(), BLOCK=BLOCK, num_warps=8)
        start += count
    return partials.sum()
