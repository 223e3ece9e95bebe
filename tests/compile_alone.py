"""Run a compile test's inductor work in a process of its own, its C++ kernels written without SIMD
vectors: what such a test checks is the graph Dynamo, AOTAutograd and inductor make (GPUs run
Triton kernels, not these), the same graph either way, and on CI's cold inductor cache g++ then
takes about half the time. It cannot be done in the pytest process: torch keeps some build options
per process, and a later vectorized kernel of the same process was built without its vector
headers (g++: 'at::vec' has not been declared). So the work runs on a one-rank pool
(tests/distributed/pool.py), which is closed after, as tests/parallel/test_compile_tp.py's ranks.
Not for a bound that only SIMD arithmetic meets: scalar kernels sum in another order
(tests/train/test_fused_loss.py's compiled chunk, 1.1e-6 against its 1e-6, compiles in-process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch._inductor.config as inductor_config

from tests.distributed.pool import close_pool, run_on_ranks


def _with_scalar_kernels(fn: Callable, *args: Any) -> Any:
    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        return fn(*args)


def compiled_alone(fn: Callable, *args: Any, timeout: float = 600) -> Any:
    """`fn(*args)` (a module-level function; arguments and result pickled) in a fresh process whose
    inductor writes scalar C++ kernels; the process is stopped after."""
    try:
        return run_on_ranks(1, _with_scalar_kernels, fn, *args, timeout=timeout)[0]
    finally:
        close_pool(1)  # it compiled without SIMD vectors: no later test may compile in it
