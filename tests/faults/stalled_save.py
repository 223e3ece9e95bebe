"""A training run whose save of step 3 stalls midway, for a test to kill the job there.

`python -m tests.faults.stalled_save MODE FOLDER` with STALL_FLAG=<file> in the environment
(MODE: disabled, async or async_with_pinned_mem): step 2 is saved completely; the save of step 3
stops after every data file is written and before DCP's .metadata, in whichever process writes
(the training process in `disabled` and `async` mode, DCP's writer process in
`async_with_pinned_mem`), which writes its pid to STALL_FLAG and sleeps until killed.

The writer process is spawned: it imports this module again (as `__mp_main__`), which is where
its stall is installed, and why everything else sits under the `__main__` guard.
"""

from __future__ import annotations

import os
import sys
import time


def _install_stall() -> None:
    from torch.distributed.checkpoint import filesystem

    original = filesystem._FileSystemWriter.finish

    def finish(self, metadata, results):
        if str(self.path).endswith("step-000003"):
            with open(os.environ["STALL_FLAG"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        return original(self, metadata, results)

    filesystem._FileSystemWriter.finish = finish


def main(mode: str, folder: str) -> None:
    import torch.distributed as dist

    from tests.checkpoint.tiny import run_layout

    _install_stall()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    run_layout("single", folder, until=3, save_at=(2, 3), async_mode=mode)
    print("THE SAVE WAS NOT KILLED", flush=True)


if __name__ == "__mp_main__" and "STALL_FLAG" in os.environ:  # DCP's writer process
    _install_stall()

if __name__ == "__main__":
    main(*sys.argv[1:3])
