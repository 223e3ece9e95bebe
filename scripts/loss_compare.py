"""Compare two runs' losses within a tolerance: `kenotron compare` (kenotron/runs/cli.py).

    python scripts/loss_compare.py outputs/debug tests/golden/debug_losses.jsonl --rtol 0.01 --assert
"""

import sys

from kenotron.runs.cli import compare_main

if __name__ == "__main__":
    sys.exit(compare_main(prog="python scripts/loss_compare.py"))
