"""Time the output projection + cross-entropy variants on one GPU (forward and backward).

    python scripts/bench_loss.py                      # 16,384 tokens, vocab 128,256, dim 2048 and 4096

Rows: the plain loss (full logits, fp32 cross-entropy), the chunked loss with the eager chunk
step, the eager chunk step compiled, the form written for the compiler, and the Triton chunk
kernel (the trainer's default on CUDA). Median of 10 timed runs after 3 warm-ups; peak memory
above the inputs. `--ce-sweep` times the Triton cross-entropy kernel alone over a (tokens,
vocab) bf16 logits buffer for each block size and warp count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kenotron.train.fused_loss import (
    _chunk_loss_and_grad,
    _chunk_loss_and_grad_for_compile,
    _triton_chunk_loss_and_grad,
    linear_cross_entropy_sum,
)
from kenotron.train.loss import cross_entropy_sum


def _time(fn, reps: int = 10) -> tuple[float, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, (torch.cuda.max_memory_allocated() - base) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--dims", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--ce-sweep", action="store_true", help="time the Triton cross-entropy's configurations")
    args = parser.parse_args()
    if args.ce_sweep:
        _ce_sweep(args.tokens, args.vocab)
        return
    print("| dim | variant | ms (fwd + bwd) | extra peak GiB |\n|---|---|---|---|")
    for dim in args.dims:
        for name, fn in _variants(args.tokens, args.vocab, dim).items():
            ms, gib = _time(fn)
            print(f"| {dim} | {name} | {ms:.2f} | {gib:.2f} |", flush=True)


def _variants(tokens: int, vocab: int, dim: int) -> dict:
    """name -> a function running forward + backward of that loss on fresh random inputs."""
    dev = torch.device("cuda")
    h = torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, dim, device=dev) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=dev)

    def plain():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = h @ w.t()
        cross_entropy_sum(logits, labels).backward()

    def chunked(chunk_fn):
        def run():
            linear_cross_entropy_sum(
                h, w, labels, chunk_tokens=tokens, compute_dtype=torch.bfloat16, chunk_fn=chunk_fn
            ).backward()

        return run

    return {
        "plain (full fp32 logits)": plain,
        "chunked, eager step": chunked(_chunk_loss_and_grad),
        "chunked, eager step compiled": chunked(torch.compile(_chunk_loss_and_grad, dynamic=False)),
        "chunked, compiler form compiled": chunked(torch.compile(_chunk_loss_and_grad_for_compile, dynamic=False)),
        "chunked, Triton step (default on CUDA)": chunked(_triton_chunk_loss_and_grad),
    }


def _ce_sweep(tokens: int, vocab: int) -> None:
    """The Triton cross-entropy alone (it overwrites the logits with their gradient; later runs
    read gradients instead, the same traffic): GB/s counts two reads and one write."""
    from kenotron.kernels.loss import cross_entropy_grad_

    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,), device="cuda")
    print("| BLOCK_V | warps | ms | GB/s |\n|---|---|---|---|")
    for block in (2048, 4096, 8192, 16384):
        for warps in (4, 8, 16):
            ms, _ = _time(lambda b=block, w=warps: cross_entropy_grad_(logits, labels, -100, block_v=b, num_warps=w))
            print(f"| {block} | {warps} | {ms:.3f} | {3 * logits.numel() * 2 / ms / 1e6:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
