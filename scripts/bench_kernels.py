"""Time the kernels a training step is made of, in isolation, on one GPU.

    python scripts/bench_kernels.py matmul      # every linear of the 1B and 8B shapes: fwd, dgrad, wgrad
    python scripts/bench_kernels.py attention   # SDPA backends and q/k/v layouts, fwd + bwd
                                                # (and FlashAttention-4 when flash-attn-4 is installed)
    python scripts/bench_kernels.py pcie        # pinned host <-> device copies (activation offloading)
    python scripts/bench_kernels.py moe         # the even split's bounded row gather and gate (ep 2)

What the step's profile cannot say: how fast each matmul shape can run alone (so whether the
step's matmul time is at cuBLAS's limit), and which attention kernel and layout is fastest.
Median of 20 runs after 5 warm-ups, bf16.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from kenotron.models.common.flash_attention import FlashAttention
from kenotron.models.common.flash_attention4 import fa4_attention, import_fa4
from kenotron.tools.kernel_profile import median_cuda_ms

SHAPES = {
    # name: (tokens, dim, ffn, heads, kv_heads, head_dim, vocab, seq)
    "1B b4x4096": (16384, 2048, 8192, 32, 8, 64, 128256, 4096),
    "8B-width b2x8192": (16384, 4096, 14336, 32, 8, 128, 128256, 8192),
}


def _linear_ms(m: int, k: int, n: int) -> tuple[float, float, float]:
    """Forward (x @ w.T), input gradient (dy @ w) and weight gradient (dy.T @ x) of one linear."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt)
    w = torch.randn(n, k, device=dev, dtype=dt)
    dy = torch.randn(m, n, device=dev, dtype=dt)
    return median_cuda_ms(lambda: x @ w.t()), median_cuda_ms(lambda: dy @ w), median_cuda_ms(lambda: dy.t() @ x)


def bench_matmuls() -> None:
    print("| shape | linear (in -> out) | fwd ms | dgrad ms | wgrad ms | TFLOP/s (all three) |\n|---|---|---|---|---|---|")
    for shape, (m, dim, ffn, h, kv, hd, vocab, _) in SHAPES.items():
        linears = {
            "wq": (dim, h * hd), "wk / wv": (dim, kv * hd), "wo": (h * hd, dim), "w1 / w3": (dim, ffn),
            "w2": (ffn, dim), "qkv fused": (dim, (h + 2 * kv) * hd), "w1+w3 fused": (dim, 2 * ffn),
            "output": (dim, vocab),
        }
        for name, (k, n) in linears.items():
            fwd, dgrad, wgrad = _linear_ms(m, k, n)
            tflops = 3 * 2 * m * k * n / ((fwd + dgrad + wgrad) * 1e-3) / 1e12
            print(f"| {shape} | {name} ({k} -> {n}) | {fwd:.3f} | {dgrad:.3f} | {wgrad:.3f} | {tflops:.0f} |", flush=True)


def _attention_ms(b: int, h: int, kv: int, seq: int, hd: int, layout: str, backend) -> tuple[float, float]:
    """Causal GQA SDPA with one backend: forward, and forward + backward, in ms."""
    from torch.nn.attention import sdpa_kernel

    dev, dt = torch.device("cuda"), torch.bfloat16

    def make(heads: int) -> torch.Tensor:
        if layout == "bshd view":  # the model's layout: a (batch, seq, heads, dim) view transposed
            t = torch.randn(b, seq, heads, hd, device=dev, dtype=dt).transpose(1, 2)
        else:
            t = torch.randn(b, heads, seq, hd, device=dev, dtype=dt)
        return t.requires_grad_()

    q, k, v = make(h), make(kv), make(kv)
    do = torch.randn(b, seq, h, hd, device=dev, dtype=dt).transpose(1, 2)

    def fwd() -> torch.Tensor:
        if backend == "fa4":  # FlashAttention-4 through kenotron's custom ops, as the model calls it
            return FlashAttention(fa4_attention, 4)(q, k, v)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return median_cuda_ms(fwd), median_cuda_ms(lambda: torch.autograd.grad(fwd(), (q, k, v), do))


def bench_attention() -> None:
    from torch.nn.attention import SDPBackend

    print("| shape | backend | q/k/v layout | fwd ms | fwd+bwd ms | TFLOP/s (causal, fwd+bwd) |\n|---|---|---|---|---|---|")
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if import_fa4() is not None:
        backends["fa4"] = "fa4"
    for shape, (tokens, _, _, h, kv, hd, _, seq) in SHAPES.items():
        b = tokens // seq
        flops = 3.5 * 2 * b * seq * seq * h * hd  # causal: fwd 2*b*s^2*h*d, bwd 2.5x
        for layout in ("bshd view", "bhsd contiguous"):
            for name, backend in backends.items():
                if backend == "fa4" and layout != "bshd view":
                    continue  # FA4 takes (b, s, h, d): the contiguous bhsd layout would be copied
                try:
                    f, fb = _attention_ms(b, h, kv, seq, hd, layout, backend)
                except RuntimeError as e:
                    print(f"| {shape} | {name} | {layout} | n/a: {str(e).splitlines()[0][:60]} | | |", flush=True)
                    continue
                print(f"| {shape} | {name} | {layout} | {f:.3f} | {fb:.3f} | {flops / (fb * 1e-3) / 1e12:.0f} |",
                      flush=True)


def bench_pcie(gib: int = 4) -> None:
    """Pinned host <-> device copies of `gib` GiB (what activation offloading moves), GB/s.
    Run one process per GPU at once to see the bandwidth each gets while all copy."""
    n = gib << 30
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    name = f"cuda:{torch.cuda.current_device()}"
    for direction, copy in (("device to host", lambda: host.copy_(device, non_blocking=True)),
                            ("host to device", lambda: device.copy_(host, non_blocking=True))):
        ms = median_cuda_ms(copy, reps=3, warmup=1)
        print(f"| {name} | {direction} | {gib} GiB | {n / ms / 1e6:.1f} GB/s |", flush=True)


# name: (tokens per rank, dim, top-k, expert ffn): the EP 2 rows of docs/performance.md.
MOE_SHAPES = {
    "Qwen3-30B-A3B b4x4096": (16384, 2048, 8, 768),
    "DeepSeek-V3 16B b4x4096": (16384, 2048, 6, 1408),
}


def _moe_rows(shape: str, tokens: int, dim: int, k: int, ffn: int) -> None:
    """One shape's rows of `bench_moe`."""
    from kenotron.kernels.expert_swiglu import expert_swiglu_backward, expert_swiglu_forward
    from kenotron.kernels.row_gather import gather_rows_until

    dev, dt = torch.device("cuda"), torch.bfloat16
    rows, end = 2 * tokens * k, tokens * k
    bound = torch.tensor([end], dtype=torch.int32, device=dev)
    x = torch.randn(tokens, dim, device=dev, dtype=dt)
    src = torch.randint(0, tokens * k, (rows,), device=dev)
    h = torch.randn(rows, 2 * ffn, device=dev, dtype=dt)
    scale = torch.rand(rows, device=dev, dtype=dt)
    grad = torch.randn(rows, ffn, device=dev, dtype=dt)
    cases = {  # name: (bounded, over every row, bytes moved per row before the bound)
        "row gather": (lambda: gather_rows_until(x, src, bound, k), lambda: x.index_select(0, src // k), 4 * dim),
        "gate forward": (lambda: expert_swiglu_forward(h, scale, bound),
                         lambda: F.silu(h[:, :ffn]) * h[:, ffn:] * scale[:, None], 6 * ffn),
        "gate backward": (lambda: expert_swiglu_backward(grad, h, scale, bound),
                          lambda: expert_swiglu_backward(grad, h, scale), 10 * ffn),
    }
    for name, (bounded, full, bytes_per_row) in cases.items():
        ms, full_ms = median_cuda_ms(bounded), median_cuda_ms(full)
        print(f"| {shape} | {name} | {rows:,} ({end:,}) | {ms:.3f} | {full_ms:.3f} | "
              f"{end * bytes_per_row / ms / 1e6:,.0f} |", flush=True)


def bench_moe() -> None:
    """Expert parallel's even split at ep 2: a grouped buffer of 2 T k rows (every received slot on
    this rank) of which routing fills T k. The bounded gather and gate (kernels/row_gather.py,
    kernels/expert_swiglu.py) stop at the last group; PyTorch's ops (and the unbounded gate) pass
    over every row."""
    print("| shape | kernel | rows (bound) | bounded ms | every row ms | GB/s (bounded, rows before the bound) |\n"
          "|---|---|---|---|---|---|")
    for shape, sizes in MOE_SHAPES.items():
        _moe_rows(shape, *sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["matmul", "attention", "pcie", "moe", "all"])
    args = parser.parse_args()
    if args.what in ("matmul", "all"):
        bench_matmuls()
    if args.what in ("attention", "all"):
        bench_attention()
    if args.what in ("pcie", "all"):
        bench_pcie()
    if args.what in ("moe", "all"):
        bench_moe()


if __name__ == "__main__":
    main()
