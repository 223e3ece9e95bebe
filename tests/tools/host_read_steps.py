"""Train a few steps of a real Trainer with tools/host_reads.py recording, in the test process or
on every rank of the pool harness: the reads of each loop iteration (step N's passes, optimizer
and balance update, then its log when N logs; tools/host_reads.py's TrainerSteps)."""

from __future__ import annotations

from kenotron.config import load_config
from kenotron.tools.host_reads import record_training
from kenotron.train.trainer import Trainer

BASE = [
    "--model.n_layers", "2", "--training.seq_len", "32", "--training.global_batch_size", "4",
    "--lr_scheduler.warmup_steps", "0", "--metrics.tensorboard", "false",
    # torch._grouped_mm, as on a GPU: the per-expert loop reads its group sizes (it must, to split).
    "--tuning.expert_kernel", "grouped_mm",
]


def reads_per_step(overrides: list[str], dump_folder: str, steps: int, log_freq: int) -> dict[int, list[str]]:
    """{step: ["op <- innermost frame", ...]} of `steps` training steps (every step has a key)."""
    cfg = load_config(None, BASE + overrides + ["--job.dump_folder", dump_folder, "--training.steps", str(steps),
                                                "--metrics.log_freq", str(log_freq)])
    trainer = Trainer(cfg)
    try:
        reads = record_training(trainer)
    finally:
        trainer.close()
    out: dict[int, list[str]] = {step: [] for step in range(1, steps + 1)}
    for read in reads.reads:
        out.setdefault(read.label, []).append(f"{read.op} <- {' <- '.join(read.stack[:2])}")
    return out
