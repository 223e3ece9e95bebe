"""How far the step's matmuls are from the fastest cuBLASLt algorithm for their shapes.

    python scripts/bench_gemm_algos.py [--limit 24] [--shapes 8B-width]

For every linear of the benchmark shapes (forward x @ w.T, input gradient dy @ w, weight
gradient dy.T @ x) it times, in ms (median of CUDA-event-timed runs, bf16, random data):
torch's matmul (cuBLAS's own pick), torch with `preferred_blas_library("cublaslt")`, and every
algorithm cuBLASLt's heuristic offers for the shape (up to --limit, through nvmath-python,
which must be installed: `pip install nvmath-python`), and prints the fastest of those. A large
gap between torch's time and the fastest algorithm's says a per-shape algorithm choice would pay;
none says the matmul term of the step is at cuBLAS's limit. Also the output layer with the
vocabulary padded to a multiple of 256 / 1024, for the question whether padding pays.
"""

from __future__ import annotations

import argparse

import torch

from kenotron.tools.kernel_profile import median_cuda_ms

SHAPES = {
    # name: (tokens, dim, ffn, q heads * head_dim, kv heads * head_dim, vocab)
    "1B": (16384, 2048, 8192, 2048, 512, 128256),
    "8B-width": (16384, 4096, 14336, 4096, 1024, 128256),
}


def _products(m: int, k: int, n: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The three products of one linear (in k -> out n over m tokens) as (A, B) of A @ B."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt)
    w = torch.randn(n, k, device=dev, dtype=dt)
    dy = torch.randn(m, n, device=dev, dtype=dt)
    return {"fwd": (x, w.t()), "dgrad": (dy, w), "wgrad": (dy.t(), x)}


def _best_algorithm_ms(a: torch.Tensor, b: torch.Tensor, limit: int) -> tuple[float, float, int, int]:
    """(heuristic's first pick ms, fastest offered ms, its index, algorithms offered) via nvmath."""
    from nvmath.linalg.advanced import Matmul, MatmulPlanPreferences

    with Matmul(a, b) as mm:
        algorithms = mm.plan(preferences=MatmulPlanPreferences(limit=limit))
        times = [median_cuda_ms(lambda alg=alg: mm.execute(algorithm=alg), reps=8, warmup=2) for alg in algorithms]
    best = min(range(len(times)), key=times.__getitem__)
    return times[0], times[best], best, len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=24, help="algorithms to ask cuBLASLt's heuristic for")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    try:
        import nvmath  # noqa: F401
        have_nvmath = True
    except ImportError:
        have_nvmath = False
    print("| shape | linear | product | torch ms | torch cublaslt ms | heuristic #0 ms | fastest ms (index / offered) | "
          "gain |\n|---|---|---|---|---|---|---|---|", flush=True)
    for shape in args.shapes:
        m, dim, ffn, q, kv, vocab = SHAPES[shape]
        linears = {"wq / wo": (dim, q), "wk / wv": (dim, kv), "w1 / w3": (dim, ffn), "w2": (ffn, dim),
                   "output": (dim, vocab), "output pad256": (dim, -(-vocab // 256) * 256),
                   "output pad1024": (dim, -(-vocab // 1024) * 1024)}
        for name, (k, n) in linears.items():
            for product, (a, b) in _products(m, k, n).items():
                torch.backends.cuda.preferred_blas_library("cublas")
                t_default = median_cuda_ms(lambda a=a, b=b: a @ b)
                torch.backends.cuda.preferred_blas_library("cublaslt")
                t_lt = median_cuda_ms(lambda a=a, b=b: a @ b)
                torch.backends.cuda.preferred_blas_library("cublas")
                cells = ["n/a", "n/a", ""]
                if have_nvmath and not name.startswith("output pad"):
                    first, best, index, offered = _best_algorithm_ms(a, b, args.limit)
                    cells = [f"{first:.3f}", f"{best:.3f} ({index} / {offered})", f"{100 * (t_default / best - 1):+.1f}%"]
                print(f"| {shape} | {name} ({k} -> {n}) | {product} | {t_default:.3f} | {t_lt:.3f} | "
                      + " | ".join(cells) + " |", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
