"""Per-rank GPU memory of a kenotron job without GPUs (a dry run on fake tensors).

    python estimation.py --config llama3_8b --ngpu 64 [--section.key value ...]
                         [--gpu-memory-gib 80] [--json report.json] [--search] [--full-depth]

A thin wrapper for a clone: the installed command `kenotron estimate` is the same, from any
folder (`--config` takes a preset's name or a TOML file). The estimator lives in
kenotron/estimate, the planner and this command in kenotron/planner (see docs/estimation.md).
"""

import sys

from kenotron.planner.cli import main

if __name__ == "__main__":
    sys.exit(main())
