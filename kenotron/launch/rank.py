"""What the launcher starts on every rank: `python -m kenotron.train`'s program, told that the
launcher already ran the checks outside resolve_run (the run folder, wandb, float8), so that each
runs once, and given the features of kenotron/fault_tolerance/ that the config asks for. Started
by torchrun without the launcher, `python -m kenotron.train` runs the checks itself."""

from __future__ import annotations

import functools
import logging
import sys

from kenotron.fault_tolerance.attach import FaultToleranceExtensions
from kenotron.runtime.rank_process import exit_process, run_rank
from kenotron.train.trainer import run_training

train_launched_rank = functools.partial(run_training, checked_by_launcher=True, job_extensions=FaultToleranceExtensions())
"""What each rank runs once the config is loaded: the Trainer, told the launcher checked the run."""


def main(argv: list[str] | None = None) -> int:
    return run_rank(list(sys.argv[1:] if argv is None else argv), train_launched_rank, prog="kenotron train")


if __name__ == "__mp_main__":
    # DCP's checkpoint writer (checkpoint.async_mode async_with_pinned_mem) is a process spawned from
    # this one, which multiprocessing starts by running this module again under this name. The writer
    # logs four INFO lines per save onto the rank's console, and a failed save with every rank's
    # traceback; the save's result (its error included) goes back to the training process, which
    # reports it in one line. So the writer itself says nothing.
    logging.disable(logging.CRITICAL)

if __name__ == "__main__":
    exit_process(main())
