"""`tuning.empty_cache_after_first_step`: the CUDA allocator's cache is handed back once, after
the first step, and never with the option off; on a CPU the option does nothing."""

from __future__ import annotations

import pytest
import torch

from kenotron.config import load_config

ARGS = ["--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size", "2",
        "--training.steps", "3", "--metrics.tensorboard", "false", "--data.dataset", "synthetic"]


def _empty_cache_calls(monkeypatch, tmp_path, *extra: str) -> list[int]:
    from kenotron.train.trainer import Trainer

    calls: list[int] = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(1), real()))
    trainer = Trainer(load_config(None, [*ARGS, "--job.dump_folder", str(tmp_path), *extra]))
    try:
        per_step = []
        for _ in range(3):
            trainer.run_step(trainer.loader.next_step())
            per_step.append(len(calls))
    finally:
        trainer.close()
    return per_step


def test_empty_cache_is_not_called_on_a_cpu(monkeypatch, tmp_path):
    assert _empty_cache_calls(monkeypatch, tmp_path, "--training.device", "cpu") == [0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cache_is_emptied_once_after_the_first_step(monkeypatch, tmp_path):
    assert _empty_cache_calls(monkeypatch, tmp_path, "--training.device", "cuda") == [1, 1, 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cache_is_never_emptied_with_the_option_off(monkeypatch, tmp_path):
    assert _empty_cache_calls(monkeypatch, tmp_path, "--training.device", "cuda",
                              "--tuning.empty_cache_after_first_step", "false") == [0, 0, 0]
