"""What the launcher starts on every rank: `python -m kenotron.train`'s program, told that the
launcher already ran the checks outside resolve_run (the run folder, wandb, float8), so that each
runs once, and given the features of kenotron/fault_tolerance/ that the config asks for. Started
by torchrun without the launcher, `python -m kenotron.train` runs the checks itself."""

from __future__ import annotations

import functools
import sys

from kenotron.fault_tolerance.attach import fault_tolerance_extensions
from kenotron.runtime.rank_process import exit_process, run_rank
from kenotron.train.trainer import run_training


def main(argv: list[str] | None = None) -> int:
    train = functools.partial(run_training, checked_by_launcher=True, job_extensions=fault_tolerance_extensions)
    return run_rank(list(sys.argv[1:] if argv is None else argv), train, prog="kenotron train")


if __name__ == "__main__":
    exit_process(main())
