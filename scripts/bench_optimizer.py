"""Time one AdamW step over the parameter shapes of the reference models, on one GPU.

    python scripts/bench_optimizer.py

torch's fused AdamW (multi-tensor apply) against kenotron's TritonAdamW (one Triton kernel per
tensor, kenotron/kernels/adamw.py) at several block sizes, both with the clipping divisor
as grad_scale, as the trainer calls them. Prints ms per step and the bandwidth of the 28 bytes
per parameter the update reads and writes (fp32 weight, gradient, two moments in; weight and
moments out). Median of 10 steps after 3 warm-ups.

Then the gradient norm over bf16 gradients of the same shapes (master weights' gradients):
torch's `_foreach_norm` (one multi-tensor kernel) against kenotron's Triton sum of squares
(kenotron/kernels/sum_of_squares.py) at several block sizes; TB/s of the 2 bytes read per
parameter.
"""

from __future__ import annotations

import torch

from kenotron.kernels import adamw as triton_adamw
from kenotron.tools.kernel_profile import median_cuda_ms
from kenotron.train.optim import TritonAdamW


def llama_shapes(dim: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int, tied: bool) -> list[tuple]:
    hd = dim // heads
    block = [(dim, dim), (kv_heads * hd, dim), (kv_heads * hd, dim), (dim, dim), (ffn, dim), (dim, ffn), (ffn, dim),
             (dim,), (dim,)]
    return [(vocab, dim)] + block * layers + [(dim,)] + ([] if tied else [(vocab, dim)])


MODELS = {
    "1B (tied)": llama_shapes(2048, 8192, 16, 32, 8, 128256, tied=True),
    "8B width, 8 layers": llama_shapes(4096, 14336, 8, 32, 8, 128256, tied=False),
}


def _step(optimizer: torch.optim.Optimizer, scale: torch.Tensor) -> None:
    optimizer.grad_scale = scale
    optimizer.step()


def bench_grad_norm() -> None:
    from kenotron.kernels import sum_of_squares as sos

    print("| model | parameters | gradient norm | ms | TB/s |\n|---|---|---|---|---|")
    default_block = sos.BLOCK
    for name, shapes in MODELS.items():
        grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
        n = sum(g.numel() for g in grads)
        variants = {"torch _foreach_norm": lambda g=grads: torch.stack(torch._foreach_norm(g, 2, dtype=torch.float32))
                    .pow(2).sum()}
        for block in (4096, 8192, 16384):
            variants[f"triton, block {block}"] = (block, lambda g=grads: sos.sum_of_squares(g))
        for label, entry in variants.items():
            fn = entry
            if isinstance(entry, tuple):
                sos.BLOCK, fn = entry
            ms = median_cuda_ms(fn, reps=20, warmup=3)
            print(f"| {name} | {n / 1e9:.3f} B | {label} | {ms:.3f} | {n * 2 / ms / 1e9:.2f} |", flush=True)
        sos.BLOCK = default_block
        del grads
        torch.cuda.empty_cache()


def main() -> None:
    bench_grad_norm()
    print("| model | parameters | implementation | ms / step | TB/s |\n|---|---|---|---|---|")
    for name, shapes in MODELS.items():
        params = [torch.randn(s, device="cuda").requires_grad_() for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        n = sum(p.numel() for p in params)
        scale = torch.tensor(1.3, device="cuda")
        optimizers = {"torch fused": torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)}
        for block in (1024, 2048, 4096):
            optimizers[f"triton, block {block}"] = (block, TritonAdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                                                                        weight_decay=0.1))
        for label, entry in optimizers.items():
            if isinstance(entry, tuple):
                triton_adamw.BLOCK, optimizer = entry
            else:
                optimizer = entry
            ms = median_cuda_ms(lambda: _step(optimizer, scale), reps=10, warmup=3)  # noqa: B023 (timed before the loop moves on)
            print(f"| {name} | {n / 1e9:.3f} B | {label} | {ms:.2f} | {n * 28 / ms / 1e9:.2f} |", flush=True)
        triton_adamw.BLOCK = 1024
        del params, optimizers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
