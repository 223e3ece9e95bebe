"""Every Trainer settles `parallelism.fsdp_reshard_after_forward = "default"` and
`parallelism.cp_scheme = "auto"` itself (planner/reshard_choice.py, cp_scheme_choice.py): one
built directly, as a notebook does, chooses what a rank of `kenotron train` chooses, and rank 0
logs each choice and its reason once."""

from __future__ import annotations

import logging

from kenotron.config import load_config
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import short_run_args

LINE = "FSDP reshard after forward:"
CP_LINE = "context-parallel scheme:"


class _Lines(logging.Handler):
    """The kenotron logger's lines that name the reshard and CP scheme choices."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith((LINE, CP_LINE)):
            self.lines.append(record.getMessage())


def _both_paths(folder: str) -> dict:
    """On each rank: the choice and log lines of a Trainer built directly, then of the launcher's
    rank program training the same config."""
    # Imported on the ranks only: runpy runs kenotron.launch.rank afresh in a test of the launcher.
    from kenotron.launch.rank import train_launched_rank

    logger = logging.getLogger("kenotron")
    level = logger.level
    logger.setLevel(logging.INFO)
    out = {}
    try:
        for path in ("direct", "launched"):
            cfg = load_config(None, short_run_args(1) + ["--training.steps", "1", "--training.local_batch_size", "4",
                                                        "--parallelism.cp", "2", "--job.dump_folder", f"{folder}/{path}"])
            lines = _Lines()
            logger.addHandler(lines)
            try:
                if path == "direct":
                    trainer = Trainer(cfg)
                    policy = trainer.run.plan.settings.reshard_after_forward, trainer.run.plan.settings.cp_scheme
                    trainer.close()
                else:
                    train_launched_rank(cfg)
                    policy = None  # the rank program keeps its Trainer: its log line says the policy
            finally:
                logger.removeHandler(lines)
            out[path] = (policy, lines.lines)
    finally:
        logger.setLevel(level)
    return out


def test_a_trainer_built_directly_and_a_launched_rank_settle_reshard_and_cp_scheme_alike_and_log_them_once(tmp_path):
    # cp 2 with FSDP over the 2 ranks; "default" and "auto" in the config. On CPU the ring stays (the
    # CPU parity tests run it) whatever the heads allow (debug's 8 and 4 split over cp 2).
    ranks = run_on_ranks(2, _both_paths, str(tmp_path))
    for rank, seen in enumerate(ranks):
        policy, direct = seen["direct"]
        _, launched = seen["launched"]
        assert direct == launched, (rank, seen)
        assert len(direct) == (2 if rank == 0 else 0), (rank, seen)  # rank 0 says each once
    policy, [cp_line, line] = ranks[0]["direct"]
    assert policy == ("default", "ring"), policy
    assert line.startswith(f"{LINE} default (") and "no GPU" in line, line
    assert cp_line.startswith(f"{CP_LINE} ring (auto: no GPU") and "parity tests" in cp_line, cp_line
