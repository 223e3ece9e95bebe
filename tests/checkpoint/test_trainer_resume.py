"""Exact resume through the trainer: N steps in one go, or stopped at k and resumed to N, write
the same metrics.jsonl losses, bit for bit (fp32 on CPU), under 1 rank, FSDP 2 and FSDP 2 x TP 2.

Each layout saves in another of the three modes, so the background modes are checked end to end
too: a save that did not hold the state of its step would change the resumed losses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kenotron.config import load_config
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, train_until

STEPS, STOP_AFTER = 4, 2
COMMON = [
    "--model.n_layers", "2", "--training.seq_len", "16", "--training.global_batch_size", "4",
    "--training.local_batch_size", "2", "--training.steps", str(STEPS), "--metrics.log_freq", "1",
    "--lr_scheduler.warmup_steps", "2", "--metrics.tensorboard", "false", "--checkpoint.interval", str(STOP_AFTER),
    "--training.device", "cpu",
]


def train(folder: str, overrides: list[str], stop_after: int = 0) -> None:
    """Run the trainer (on every rank of the pool, or in this process); see train_until."""
    train_until(load_config(None, COMMON + ["--job.dump_folder", folder] + overrides), stop_after)


def losses_by_step(folder: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_records(folder)}


LAYOUTS = {
    "1rank-sync": (1, ["--checkpoint.async_mode", "disabled"]),
    "fsdp2-async_with_pinned_mem": (2, ["--checkpoint.async_mode", "async_with_pinned_mem"]),
    "fsdp2_tp2-async": (4, ["--parallelism.dp_shard", "2", "--parallelism.tp", "2", "--checkpoint.async_mode", "async"]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_stopped_and_resumed_run_logs_the_same_losses_bitwise(layout, tmp_path):
    world, overrides = LAYOUTS[layout]

    def run(folder: Path, extra: list[str], stop_after: int = 0) -> None:
        if world == 1:
            train(str(folder), overrides + extra, stop_after)
        else:
            run_on_ranks(world, train, str(folder), overrides + extra, stop_after)

    run(tmp_path / "full", [])  # checkpointing off: saving must not change training either
    run(tmp_path / "resumed", ["--checkpoint.enable", "true"], stop_after=STOP_AFTER)
    assert list(losses_by_step(tmp_path / "resumed")) == list(range(1, STOP_AFTER + 1))
    run(tmp_path / "resumed", ["--checkpoint.enable", "true"])
    full, resumed = losses_by_step(tmp_path / "full"), losses_by_step(tmp_path / "resumed")
    assert list(resumed) == list(range(1, STEPS + 1))
    assert resumed == full


def _writer_meeting_point() -> tuple[int, int]:
    """On a pool rank: the port DCP's writer processes would meet on once the pinned mode's saver
    exists, and the pool's store port (where torchrun's MASTER_PORT is)."""
    import os

    import torch.distributed as dist
    from torch.distributed.checkpoint._async_process_executor import _ProcessGroupInitInfo

    from kenotron.checkpoint.saver import DcpSaver

    saver = DcpSaver("async_with_pinned_mem")
    try:
        return _ProcessGroupInitInfo(dist.group.WORLD).tcp_store_master_port, int(os.environ["MASTER_PORT"])
    finally:
        saver.close()


def test_pinned_mode_writers_meet_on_the_launchers_store_instead_of_a_port_picked_and_closed():
    """Regression: rank 0 used to pick a free port for the writers and close it; a connection
    opened before its writer listened could take it (EADDRINUSE in the pinned resume case)."""
    for writers_port, store_port in run_on_ranks(2, _writer_meeting_point):
        assert writers_port == store_port
