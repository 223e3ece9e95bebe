"""A training run whose save of step 3 stalls in the training process, for a test to kill it there.

`python -m tests.faults.stalled_save MODE FOLDER FLAG` (MODE: disabled or async): step 2 is saved
completely; the save of step 3 stops after every data file is written and before DCP's .metadata
(in the training process: the caller in `disabled` mode, DCP's thread in `async` mode), writes the
process id to FLAG and sleeps until killed.
"""

from __future__ import annotations

import os
import sys
import time


def _install_stall(flag: str) -> None:
    from torch.distributed.checkpoint import filesystem

    original = filesystem._FileSystemWriter.finish

    def finish(self, metadata, results):
        if str(self.path).endswith("step-000003"):
            with open(flag, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        return original(self, metadata, results)

    filesystem._FileSystemWriter.finish = finish


def main(mode: str, folder: str, flag: str) -> None:
    from tests.checkpoint.tiny import run_layout

    _install_stall(flag)
    run_layout("single", folder, until=3, save_at=(2, 3), async_mode=mode)
    print("THE SAVE WAS NOT KILLED", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
