"""A six-step debug-model training run and its metrics.jsonl, shared by the multi-rank trainer
tests (run on every rank through tests.distributed.pool.run_on_ranks, so module-level)."""

from __future__ import annotations

import json
from pathlib import Path

from kenotron.config import load_config
from kenotron.train.trainer import run_training


def short_run_args(n_layers: int) -> list[str]:
    """Global batch 8 of 32-token windows, 6 steps, a record every 2 steps, no TensorBoard."""
    return [
        "--model.n_layers", str(n_layers), "--training.seq_len", "32", "--training.global_batch_size", "8",
        "--training.steps", "6", "--metrics.log_freq", "2", "--lr_scheduler.warmup_steps", "2",
        "--metrics.tensorboard", "false",
    ]


def train_short_run(n_layers: int, overrides: list[str], folder: str) -> None:
    run_training(load_config(None, short_run_args(n_layers) + ["--job.dump_folder", folder] + overrides))


def read_records(folder: Path) -> list[dict]:
    """The records rank 0 wrote to metrics.jsonl."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
