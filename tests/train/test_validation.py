"""Validation: the eval pass of the shared step (forward and loss, no backward) gives the loss the
training forward gives, touches no gradient, leaves training unchanged, and agrees with the 1-rank
run under every parallel layout, pipeline schedules included."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kenotron.config import load_config
from kenotron.data.sample_data import write_sample_data
from kenotron.train.step import eval_loss, forward_backward
from kenotron.train.trainer import Trainer, run_training
from tests.distributed.pool import run_on_ranks

N_LAYERS, STEPS, BATCHES, G, SEQ = 4, 3, 2, 8, 32


@pytest.fixture(scope="module")
def validation_folder(tmp_path_factory) -> str:
    return str(write_sample_data(tmp_path_factory.mktemp("val"), workers=1)[1])


def args(folder: str, validation: str, every: int = 2) -> list[str]:
    return [
        "--model.n_layers", str(N_LAYERS), "--training.seq_len", str(SEQ), "--training.global_batch_size", str(G),
        "--training.steps", str(STEPS), "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "1",
        "--metrics.tensorboard", "false", "--job.dump_folder", folder, "--training.device", "cpu",
        "--validation.every", str(every), "--validation.path", validation, "--validation.batches", str(BATCHES),
    ]


def run(folder: str, validation: str, overrides: list[str], every: int = 2) -> None:
    run_training(load_config(None, args(folder, validation, every) + overrides))


def records(folder: Path) -> tuple[dict[int, float], dict[int, dict]]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if "loss" in r}, {r["step"]: r for r in lines if "val_loss" in r}


@pytest.fixture(scope="module")
def reference(validation_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    run(str(folder), validation_folder, ["--training.local_batch_size", str(G)])
    return records(folder)


def test_eval_pass_is_the_training_forward_without_backward(validation_folder, tmp_path):
    cfg = load_config(None, args(str(tmp_path), validation_folder) + ["--training.local_batch_size", "4"])
    trainer = Trainer(cfg)
    try:
        batch = next(iter(trainer.validation))
        evaluated = eval_loss(trainer.job, batch)
        assert all(p.grad is None for p in trainer.job.model.parameters())
        trained = forward_backward(trainer.job, batch)
        assert torch.equal(evaluated, trained)
    finally:
        trainer.close()


def test_validation_records_and_training_unchanged(reference, validation_folder, tmp_path):
    train_losses, validations = reference
    assert sorted(validations) == [2, 3]  # every 2 steps, and after the last
    for rec in validations.values():
        assert rec["val_ppl"] == pytest.approx(math.exp(rec["val_loss"]))
        assert rec["val_tokens"] == BATCHES * G * SEQ
    assert validations[3]["val_loss"] < validations[2]["val_loss"] + 0.5
    run(str(tmp_path), validation_folder, ["--training.local_batch_size", str(G)], every=0)
    assert records(tmp_path)[0] == train_losses  # evaluating changed nothing in training


LAYOUTS = {
    "fsdp2": (2, ["--parallelism.dp_shard", "2", "--training.local_batch_size", "2"]),
    "tp2": (2, ["--parallelism.tp", "2"]),
    "cp2": (2, ["--parallelism.cp", "2"]),
    "pp2_1f1b_cp2": (4, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "1F1B", "--parallelism.cp", "2"]),
    "pp2_interleaved": (2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "Interleaved1F1B",
                            "--parallelism.pp_stages_per_rank", "2"]),
    "pp2_zbv": (2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble"]),
    "pp2_tp2": (4, ["--parallelism.pp", "2", "--parallelism.tp", "2", "--parallelism.pp_microbatches", "2"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_validation_loss_is_the_same_under_every_layout(layout, reference, validation_folder, tmp_path):
    world, overrides = LAYOUTS[layout]
    run_on_ranks(world, run, str(tmp_path), validation_folder, overrides)
    train_losses, validations = records(tmp_path)
    ref_train, ref_val = reference
    assert sorted(validations) == sorted(ref_val)
    for step, rec in validations.items():
        assert abs(rec["val_loss"] - ref_val[step]["val_loss"]) < 1e-4, (layout, rec, ref_val[step])
    for step, loss in train_losses.items():  # training after an evaluation continues as before
        assert abs(loss - ref_train[step]) < 1e-4, (layout, step)
