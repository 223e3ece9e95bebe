"""torch.compile per block under TP + sequence parallel (the embedding-output pitfall) on CPU."""

from __future__ import annotations

import pytest
import torch._inductor.config as inductor_config

from tests.distributed.pool import close_pool, run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

ONE_LAYER = ["--model.n_layers", "1"]
# deepseek_v3: one MLA block with experts (inductor on 2 busy CPU cores takes minutes a graph), 4
# experts in 2 groups, one group routed to: the CPU's expert loop is compiled per expert (8: 82 s,
# 4: 55 s on 2 loaded cores); group-limited routing stays in the graph.
MODELS = {"llama3": ONE_LAYER, "deepseek_v3": ["--model.name", "deepseek_v3", "--model.n_layers", "1",
                                               "--model.n_dense_layers", "0", "--model.moe.n_experts", "4",
                                               "--model.moe.n_groups", "2", "--model.moe.topk_groups", "1"]}


def _compiled_steps(overrides: list[str], folder: str, steps: int) -> dict:
    """run_steps with inductor's C++ kernels written without SIMD vectors: what is checked here is the
    graph Dynamo, AOTAutograd and inductor make of a DTensor block, the same graph either way (GPUs
    run Triton kernels, not these); on a cold cache g++ then takes half the time (llama3 27 -> 16 s,
    deepseek_v3 79 -> 39 s on 2 cores), the suite's costliest compile. A process must not compile
    both ways: torch keeps some build options per process, and a later vectorized kernel was then
    built without its vector headers (g++: 'at::vec' has not been declared), so the test closes
    the pool after it."""
    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        return run_steps(overrides, folder, steps)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_compiled_blocks_with_tp_and_sequence_parallel_match_eager_one_rank(model, tmp_path):
    reference = run_steps(MODELS[model], str(tmp_path / "ref"), 2)
    # The loss's chunk step eager: what is checked is the blocks' graph. Compiled, its kernel may
    # come from inductor's cache built with vectors by another test (test_vocab_parallel_loss.py
    # checks the compiled chunk step), which these scalar-kernel ranks cannot build (_compiled_steps).
    overrides = MODELS[model] + ["--parallelism.tp", "2", "--training.local_batch_size", "8", "--compile.enable", "true",
                                 "--tuning.loss_kernel", "torch"]
    try:
        results = run_on_ranks(2, _compiled_steps, overrides, str(tmp_path), 2, timeout=600)
    finally:
        close_pool(2)  # its ranks compiled without SIMD vectors (see _compiled_steps)
    # Inductor fuses and reorders fp32 arithmetic: close, not bitwise. The sigmoid router's gradient
    # (through the balancing term's statistics) moves most: 4.6e-6 measured (2.1e-5 with 8 experts).
    assert_parity(reference, results, loss_tol=1e-5, grad_tol=5e-5 if model == "deepseek_v3" else 1e-5)


def test_async_tp_on_cpu_is_refused_before_any_process_group():
    from kenotron.config import ConfigError, load_config
    from kenotron.train.resolve import resolve_run

    cfg = load_config(None, ["--parallelism.tp", "2", "--parallelism.async_tp", "true", "--training.device", "cpu"])
    with pytest.raises(ConfigError, match=r"parallelism.async_tp needs CUDA and compile.enable=true"):
        resolve_run(cfg, world_size=2)
