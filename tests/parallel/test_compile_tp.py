"""torch.compile per block under TP + sequence parallel (the embedding-output pitfall) on CPU.

The compiled runs are tests/parallel/compile_tp_runs.py's, run ahead in the background lane
(tests/ahead.py) in a process forked by the trainer-preloaded server: both models' one-rank eager
references and their compiled TP 2 runs on two ranks; each model's test compares them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.ahead import Lane
from tests.fork_server import TRAINER_PRELOAD, fork_server
from tests.parallel.compile_tp_runs import MODELS
from tests.parallel.parity import assert_parity


def compiled_tp_runs(folder: Path, lane: Lane) -> dict[str, tuple[dict, list[dict]]]:
    """`python -m tests.parallel.compile_tp_runs FOLDER` in a forked process; what it pickled."""
    code, out, err = fork_server(TRAINER_PRELOAD).run(["-m", "tests.parallel.compile_tp_runs", str(folder)], 1200)
    assert code == 0, (err or out)[-4000:]
    with open(folder / "results.pkl", "rb") as f:
        return pickle.load(f)


@pytest.mark.slow
@pytest.mark.run_ahead(job=compiled_tp_runs)
@pytest.mark.parametrize("model", list(MODELS))
def test_compiled_blocks_with_tp_and_sequence_parallel_match_eager_one_rank(model, ran_ahead):
    reference, results = ran_ahead[model]
    # Inductor fuses and reorders fp32 arithmetic: close, not bitwise. The sigmoid router's gradient
    # (through the balancing term's statistics) moves most: 4.6e-6 measured (2.1e-5 with 8 experts).
    assert_parity(reference, results, loss_tol=1e-5, grad_tol=5e-5 if model == "deepseek_v3" else 1e-5)


def test_async_tp_on_cpu_is_refused_before_any_process_group():
    from kenotron.config import ConfigError, load_config
    from kenotron.train.resolve import resolve_run

    cfg = load_config(None, ["--parallelism.tp", "2", "--parallelism.async_tp", "true", "--training.device", "cpu"])
    with pytest.raises(ConfigError, match=r"parallelism.async_tp needs CUDA and compile.enable=true"):
        resolve_run(cfg, world_size=2)
