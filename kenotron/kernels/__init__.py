"""Triton kernels and the choice of which one runs.

- `select`: which kernel runs for each config field that offers one (no triton import).
- `adamw`: the AdamW update, one Triton kernel per tensor.
- `loss`: the fused loss's cross-entropy-with-gradient and backward scale.
- `rope_swiglu`: RoPE and SwiGLU's gate for uncompiled blocks.
- `sum_of_squares`: the gradient norm's sum of squares.

Every kernel module imports `triton` when imported: import it where the kernel is chosen, not at
the top of a module that also runs on CPU. This package imports nothing of kenotron but
`kenotron.errors`, so models, parallel and train may all use it.
"""
