"""The runs tests/parallel/test_compile_tp.py checks, as a process of their own: per model, the eager
one-rank reference and the compiled TP 2 run on two pool ranks, pickled into FOLDER/results.pkl.

`python -m tests.parallel.compile_tp_runs FOLDER`. The test's `run_ahead` job starts it through the
trainer-preloaded fork server (tests/fork_server.py), so that its inductor work (~35 s with a warm
cache, ~70 s cold, on two cores) runs in the background lane while the in-process tests run
(tests/ahead.py); the test compares what it left.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch._inductor.config as inductor_config

from tests.parallel.parity import run_steps

ONE_LAYER = ["--model.n_layers", "1"]
# deepseek_v3: one MLA block with experts (inductor on 2 busy CPU cores takes minutes a graph), 4
# experts in 2 groups, one group routed to: the CPU's expert loop is compiled per expert (8: 82 s,
# 4: 55 s on 2 loaded cores); group-limited routing stays in the graph.
MODELS = {"llama3": ONE_LAYER, "deepseek_v3": ["--model.name", "deepseek_v3", "--model.n_layers", "1",
                                               "--model.n_dense_layers", "0", "--model.moe.n_experts", "4",
                                               "--model.moe.n_groups", "2", "--model.moe.topk_groups", "1"]}
COMPILED_TP = ["--parallelism.tp", "2", "--training.local_batch_size", "8", "--compile.enable", "true"]
"""What the compiled run adds to a model's overrides: TP 2 (with sequence parallel) and compiled blocks."""


def compiled_steps(overrides: list[str], folder: str, steps: int) -> dict:
    """run_steps with inductor's C++ kernels written without SIMD vectors: what is checked is the
    graph Dynamo, AOTAutograd and inductor make of a DTensor block, the same graph either way (GPUs
    run Triton kernels, not these); on a cold cache g++ then takes half the time (llama3 27 -> 16 s,
    deepseek_v3 79 -> 39 s on 2 cores)."""
    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        return run_steps(overrides, folder, steps)


def run_all(folder: Path) -> dict[str, tuple[dict, list[dict]]]:
    """Per model: (the one-rank eager reference, the two ranks' compiled TP results), 2 steps each."""
    from tests.distributed.pool import run_on_ranks, shutdown_pools

    results = {}
    try:
        for model, overrides in MODELS.items():
            reference = run_steps(overrides, str(folder / model / "reference"), 2)
            ranks = run_on_ranks(2, compiled_steps, overrides + COMPILED_TP, str(folder / model), 2, timeout=600)
            results[model] = (reference, ranks)
    finally:
        shutdown_pools()  # this process ends with os._exit (a forked child): atexit would not run
    return results


if __name__ == "__main__":
    # Through the module's importable name: the ranks look `compiled_steps` up by its module's name,
    # which `__main__` is not for them.
    from tests.parallel.compile_tp_runs import run_all as run_all_by_name

    out = Path(sys.argv[1])
    results = run_all_by_name(out)
    with open(out / "results.pkl", "wb") as f:
        pickle.dump(results, f)
