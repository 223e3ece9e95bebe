"""The divergence guard: a NaN between logging steps stops the run before any bad state is saved."""

from __future__ import annotations

import logging
import re

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from kenotron.checkpoint import list_step_folders
from kenotron.checkpoint.trust import read_metadata
from kenotron.config import load_config
from kenotron.runtime.divergence import NonFiniteLossError
from kenotron.train.trainer import run_training

TINY = ["--training.seq_len", "64", "--training.local_batch_size", "2", "--model.n_layers", "2"]


def saved_model_tensors(folder) -> dict[str, torch.Tensor]:
    """Every tensor of the model part of a checkpoint folder, read in this process."""
    metadata = read_metadata(folder)
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state


def test_divergence_between_logging_steps_stops_before_saving_it_and_keeps_the_last_good_checkpoint(tmp_path, caplog):
    cfg = load_config(None, TINY + [
        "--training.steps", "20", "--metrics.log_freq", "10", "--optimizer.lr", "30", "--checkpoint.enable", "true",
        "--checkpoint.interval", "2",
        "--checkpoint.keep_latest_k", "2", "--job.dump_folder", str(tmp_path),
    ])
    with pytest.raises(NonFiniteLossError, match=r"is (nan|inf) at step (\d+): training stopped.*Lower optimizer.lr "
                                                 r"\(now 30\).* or lower training.max_norm \(now 1\)") as raised:
        run_training(cfg)
    # Which step lr 30 first breaks depends on the CPU's kernels (step 7 with AVX2, 9 with AVX-512):
    # the saves at the even steps before it complete, the next one is refused.
    bad = int(re.search(r"at step (\d+)", str(raised.value)).group(1))
    assert 5 <= bad < 20, f"lr 30 should diverge between logging steps, after two saves (step {bad})"
    last_good = (bad - 1) // 2 * 2
    complete = [f for f in list_step_folders(tmp_path / "checkpoints") if f.complete]
    assert [f.step for f in complete] == [last_good - 2, last_good], f"the norm is non-finite at step {bad}"
    for f in complete:
        for name, tensor in saved_model_tensors(f.path).items():
            assert torch.isfinite(tensor).all(), f"{f.path.name} holds non-finite {name}"
    # The last good checkpoint resumes; with training.steps at its step, the run says there is nothing to do.
    cfg = load_config(None, TINY + ["--training.steps", str(last_good), "--checkpoint.enable", "true",
                                    "--job.dump_folder", str(tmp_path)])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kenotron"):
        assert run_training(cfg) == []
    assert (f"resumed at step {last_good}, and training.steps={last_good}: nothing left to train. Raise "
            "training.steps") in caplog.text
