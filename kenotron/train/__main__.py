"""`python -m kenotron.train --config X.toml [--section.key value ...]`: one training process.

`kenotron train` / `./run_train.sh` start one of these per rank through torchrun
(kenotron/launch/launcher.py). Its exit codes and its one last line: kenotron/runtime/rank_process.py.
"""

from __future__ import annotations

import sys

from kenotron.runtime.rank_process import exit_process, run_rank
from kenotron.train.trainer import run_training


def main(argv: list[str] | None = None) -> int:
    return run_rank(list(sys.argv[1:] if argv is None else argv), run_training)


if __name__ == "__main__":
    exit_process(main())
