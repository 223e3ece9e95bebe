"""Trainer runs shared by the trainer tests: a six-step debug-model run, a run stopped after a
step the way a killed job stops, and the records a run wrote to metrics.jsonl. Module-level, so
tests.distributed.pool.run_on_ranks can run them on every rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kenotron.config import JobConfig, load_config
from kenotron.train.trainer import Trainer, run_training


def short_run_args(n_layers: int) -> list[str]:
    """Global batch 8 of 32-token windows, 6 steps, a record every 2 steps, no TensorBoard, on the CPU."""
    return [
        "--model.n_layers", str(n_layers), "--training.seq_len", "32", "--training.global_batch_size", "8",
        "--training.steps", "6", "--metrics.log_freq", "2", "--lr_scheduler.warmup_steps", "2",
        "--metrics.tensorboard", "false",
        "--training.device", "cpu",  # as tests/parallel/parity.py's BASE: the pool's gloo group
    ]


def train_short_run(n_layers: int, overrides: list[str], folder: str) -> None:
    run_training(load_config(None, short_run_args(n_layers) + ["--job.dump_folder", folder] + overrides))


class Stopped(Exception):
    """Ends a run after a step, the way a killed job would (the loop is left mid-way)."""


def train_until(cfg: JobConfig, stop_after: int = 0) -> Any:
    """Train `cfg` (on every rank of the pool, or in this process) and return what Trainer.train
    returns; with `stop_after`, stop after that step, at the moment the trainer would fetch the
    next batch, and return None. The trainer is closed either way."""
    trainer = Trainer(cfg)
    if stop_after:
        next_step = trainer.loader.next_step

        def next_step_or_stop():
            if trainer.step == stop_after:
                raise Stopped
            return next_step()

        trainer.loader.next_step = next_step_or_stop
    try:
        return trainer.train()
    except Stopped:
        return None
    finally:
        trainer.close()


def read_records(folder: Path) -> list[dict]:
    """The records rank 0 wrote to metrics.jsonl."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
