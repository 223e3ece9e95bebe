"""The link's bus bandwidth per collective (see kenotron/tools/collectives.py).

    torchrun --nproc-per-node 2 scripts/bench_collectives.py
    NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 scripts/bench_collectives.py --mib 64 512
"""

import sys

from kenotron.tools.collectives import main

if __name__ == "__main__":
    sys.exit(main())
