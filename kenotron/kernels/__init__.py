"""Triton kernels and the custom ops around them; which one runs is kenotron/kernel_choice/.

- `adamw`: the AdamW update, one Triton kernel per tensor.
- `loss`: the fused loss's cross-entropy-with-gradient and backward scale.
- `rope_swiglu`: RoPE and SwiGLU's gate for uncompiled blocks.
- `expert_swiglu`: SwiGLU's gate of the eager MoE experts, and (with a bound read on the
  device) of expert parallel's even split in any block.
- `row_gather`: the experts' row gather that stops at the grouped buffer's last group (this
  one's and the bounded gate's custom ops: models/common/grouped_tail.py, beside the experts).
- `sum_of_squares`: the gradient norm's sum of squares.
- `ssd`, `ssd_backward`, `ssd_op`: Mamba-2's chunked scan, forward and backward, as a custom op.
- `mamba_mixer`, `mamba_mixer_op`: the Mamba-2 mixer's convolution, scan and gated norm as one op.
- `workspace`: the kernels' scratch buffers, which the memory estimator books.

Every kernel module imports `triton` when imported: import it where the kernel is chosen, not at
the top of a module that also runs on CPU (the `*_op` modules register their ops without triton
and import their kernels on first call). This package imports nothing else of kenotron, so
models, parallel and train may all use it.
"""
