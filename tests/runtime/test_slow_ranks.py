"""Slow ranks named: the rank whose compute per step exceeds the median's by the margin is in the
log line and in metrics.jsonl; with equal ranks nobody is named."""

from __future__ import annotations

import logging
import time

import torch.distributed as dist

from kenotron.config import load_config
from kenotron.runtime.slow_ranks import MIN_STEP_SHARE, SLOW_MARGIN, slowest
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, short_run_args

BUSY_S = 0.3
"""Extra compute per step of the rank slowed on purpose (a busy loop: a slow rank computes). Rank
0's first step does more host work than the others' (its first log line and records): the loop
must outweigh it by the margin, also on a busy 2-core machine."""


def test_slowest_names_a_rank_only_beyond_the_margin_over_the_median():
    assert slowest([0.10, 0.12, 0.30, 0.10]) == {"slowest_rank": 2, "slowest_rank_s": 0.30,
                                                 "median_rank_s": 0.10, "slow_rank_named": True}
    within = 0.10 * (1 + SLOW_MARGIN) * 0.99
    assert slowest([0.10, within, 0.10])["slow_rank_named"] is False
    assert slowest([0.10, 0.20])["slow_rank_named"] is True  # two ranks: against the other one
    assert slowest([0.0001, 0.0003])["slow_rank_named"] is False  # beyond the margin, below MIN_GAP_S


def test_a_gap_that_costs_the_step_little_names_nobody():
    # A healthy 2 x H100 DDP run's launch times (2026-11-27): 38% apart, 6% of a 310 ms step.
    assert slowest([0.048, 0.066], step_wall_s=0.31)["slow_rank_named"] is False
    assert slowest([0.048, 0.066 + MIN_STEP_SHARE * 0.31], step_wall_s=0.31)["slow_rank_named"] is True


def _train_with_rank_slowed(folder: str, slow_rank: int) -> list[str]:
    cfg = load_config(None, short_run_args(1) + ["--job.dump_folder", folder, "--training.device", "cpu",
                                         "--training.local_batch_size", "2"])
    trainer = Trainer(cfg)
    run_step = trainer.run_step

    def slowed(microbatches):
        if dist.get_rank() == slow_rank:
            end = time.thread_time() + BUSY_S
            while time.thread_time() < end:
                pass
        return run_step(microbatches)

    trainer.run_step = slowed
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("kenotron")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        trainer.train()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        trainer.close()
    return [line for line in lines if line.startswith("step ")]


def test_a_rank_slowed_on_purpose_is_named_in_the_log_line_and_metrics(tmp_path):
    lines = run_on_ranks(2, _train_with_rank_slowed, str(tmp_path), 1)[0]
    records = [r for r in read_records(tmp_path) if "loss" in r]
    assert records and all(r["slowest_rank"] == 1 and r["slow_rank_named"] for r in records), records
    assert all(r["slowest_rank_s"] - r["median_rank_s"] > BUSY_S / 2 for r in records), records
    assert lines and all("slow rank 1:" in line for line in lines), lines
