"""A training run whose checkpoint writer process stalls (and is then killed) in the middle of a save.

Run as `python -m tests.checkpoint.crash_writer FOLDER` with STALL_FLAG=<file> in the environment;
used by test_crash_safety.py. Step 2 is saved completely; the save of step 3 stalls in the writer
process after every data file is written and before DCP's .metadata, and the writer writes its pid
to STALL_FLAG so that the test can kill it there. This script then reports what the manager said.

The writer process is spawned: it imports this module again (as `__mp_main__`), which is where the
stall is installed, and why everything else sits under the `__main__` guard.
"""

from __future__ import annotations

import os
import sys
import time

STALLED_STEP_FOLDER = "step-000003"


def _install_stall_in_writer() -> None:
    from torch.distributed.checkpoint import filesystem

    original = filesystem._FileSystemWriter.finish

    def finish(self, metadata, results):
        if str(self.path).endswith(STALLED_STEP_FOLDER):
            with open(os.environ["STALL_FLAG"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        return original(self, metadata, results)

    filesystem._FileSystemWriter.finish = finish


def main(folder: str) -> None:
    import torch.distributed as dist

    from kenotron.checkpoint import CheckpointSaveError
    from tests.checkpoint.tiny import run_layout

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        run_layout("single", folder, until=3, save_at=(2, 3), async_mode="async_with_pinned_mem")
    except CheckpointSaveError as exc:
        print(f"SAVE FAILED: {exc}", flush=True)
    else:
        print("SAVE DID NOT FAIL", flush=True)
    dist.destroy_process_group()


if __name__ == "__mp_main__" and "STALL_FLAG" in os.environ:  # the spawned writer process
    _install_stall_in_writer()

if __name__ == "__main__":
    main(sys.argv[1])
