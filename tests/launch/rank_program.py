"""A stand-in for the trainer that the launcher tests start on every rank (no torch: fast).

    python -m tests.launch.rank_program MODE PIDFILE_DIR [--config ...]

MODE: `config-error-on-1` (rank 1 reports a config error, exit 2; rank 0 waits to be stopped),
`abort-on-1` (rank 1 dies of SIGABRT), `sleep` (every rank writes its pid and waits),
`ok` (exit 0).
"""

from __future__ import annotations

import os
import sys
import time

from kenotron.config import split_config_arg
from kenotron.runtime.worker_guard import WorkerGuard, exit_code_of, report_failure


def main(argv: list[str]) -> int:
    mode, pid_dir = argv[0], argv[1]
    split_config_arg(argv[2:])
    rank = int(os.environ.get("RANK", "0"))
    WorkerGuard.install(grace_s=5.0)
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    try:
        if mode == "ok":
            return 0
        if mode == "config-error-on-1" and rank == 1:
            report_failure("kenotron: config error: data.path='missing.jsonl' does not exist", kind="config")
            return 2
        if mode == "abort-on-1" and rank == 1:
            print("rank 1 about to abort", file=sys.stderr, flush=True)
            os.abort()
        time.sleep(120)
        return 0
    except KeyboardInterrupt as stop:
        report_failure(f"kenotron: interrupted on rank {rank}", kind="interrupted")
        return exit_code_of(stop)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
