"""Training benchmark: one table row per configuration (see kenotron/tools/bench.py).

    python scripts/bench.py --preset h200-1gpu
    python scripts/bench.py --ngpu 4 --preset h200-4gpu --json results.json
"""

import sys

from kenotron.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
