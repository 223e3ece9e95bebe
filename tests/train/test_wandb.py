"""metrics.wandb: the records go to Weights & Biases (offline here) as the same scalars TensorBoard gets."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.train.trainer import run_training
from tests.runtime.test_run_folder import _tensorboard_steps

TINY = ["--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size", "2",
        "--training.steps", "3", "--metrics.log_freq", "1", "--training.device", "cpu"]


def test_wandb_gets_the_scalars_tensorboard_gets(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from kenotron.train import wandb_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: list[tuple[int, dict]] = []
    real_log = wandb_logger.WandbSink.log

    def spy(self, record):
        real_log(self, record)
        logged.append((record["step"], dict(record)))

    monkeypatch.setattr(wandb_logger.WandbSink, "log", spy)
    folder = tmp_path / "run"
    run_training(load_config(None, TINY + ["--job.dump_folder", str(folder), "--metrics.tensorboard", "true",
                                           "--metrics.wandb", "true"]))
    assert [step for step, _ in logged] == [1, 2, 3]
    assert list((folder / "wandb").glob("offline-run-*")), "the offline run was not written"
    assert (folder / "wandb_id").read_text().strip()
    tb = _tensorboard_steps(folder)
    assert [(s, round(r["loss"], 4)) for s, r in logged] == tb


def test_wandb_missing_is_a_config_error(monkeypatch):
    import builtins

    from kenotron.train.wandb_logger import check_wandb

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"metrics.wandb=true needs the wandb package: pip install 'kenotron\[wandb\]'"):
        check_wandb(load_config(None, ["--metrics.wandb", "true"]))
