"""The progress watchdog in one process, over torch's in-process store: whom it names, and when it stays quiet."""

from __future__ import annotations

import contextlib
import datetime
import re
import threading
import time
from collections.abc import Iterator

import torch.distributed as dist

from kenotron.runtime.watchdog import KEY_PREFIX, WAITING_FOR_DATA, ProgressWatchdog


def make_store() -> dist.HashStore:
    """torch's in-process store: like the job's TCPStore, reading a missing key waits for it (here 5 s)."""
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    return store


def watch(store: dist.HashStore, progress, seconds: float, timeout_s: float = 2.0) -> ProgressWatchdog:
    """Run a watchdog for `seconds` (all of them: a test that expects silence must wait it out)."""
    dog = ProgressWatchdog(store, 0, 2, timeout_s, progress).start()
    time.sleep(seconds)
    dog.stop()
    return dog


def watch_until_named(store: dist.HashStore, progress, timeout_s: float = 2.0, within: float = 60.0,
                      **kwargs) -> ProgressWatchdog:
    """Run a watchdog until it names a rank (its first diagnosis), failing after `within` seconds."""
    dog = ProgressWatchdog(store, 0, 2, timeout_s, progress, **kwargs).start()
    deadline = time.monotonic() + within
    while not dog.diagnosis and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert dog.diagnosis, f"the watchdog named nobody within {within} s"
    return dog


def test_a_rank_whose_heartbeat_stops_is_named_as_stopped():
    store = make_store()
    store.set(KEY_PREFIX + "1", "7 3 otherhost 4242")  # rank 1 beat once, then froze
    dog = watch_until_named(store, lambda: 4)  # (after warn_after_s 1 s and stale_after_s 2 s)
    assert "rank 1 (pid 4242 on otherhost) has sent no heartbeat for" in dog.diagnosis
    assert "its last one at step 3" in dog.diagnosis


@contextlib.contextmanager
def beating(store: dist.HashStore, step: int, activity: str = "step") -> Iterator[None]:
    """Rank 1 alive at `step` while the block runs: a heartbeat every 0.1 s from a thread."""
    done = threading.Event()

    def beat() -> None:
        n = 0
        while not done.is_set():
            n += 1
            store.set(KEY_PREFIX + "1", f"{n} {step} otherhost 4242 {activity}")
            time.sleep(0.1)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_live_rank_behind_in_steps_is_named_as_stuck_inside_the_step():
    store = make_store()
    with beating(store, step=3):
        dog = watch_until_named(store, lambda: 4)
    assert dog.diagnosis.startswith("rank 1 (pid 4242 on otherhost) is alive but still at step 3")


def test_ranks_stalled_alike_are_not_suspected():
    store = make_store()
    with beating(store, step=4):  # alive, at the same step as this rank (a long compile)
        dog = watch(store, lambda: 4, 3.0)
    assert dog.diagnosis == ""


def test_a_rank_that_stops_before_its_first_heartbeat_is_named_without_blocking_on_its_missing_key():
    store = make_store()  # rank 1 never published a heartbeat: reading its key would wait 5 s, then fail
    dog = watch_until_named(store, lambda: 4, within=4.5)
    assert dog.diagnosis.startswith("rank 1 has sent no heartbeat since the job started"), dog.diagnosis
    assert store.check([KEY_PREFIX + "0"])  # this rank's own heartbeat is there


def test_a_rank_whose_loader_hangs_names_itself_and_the_loader(caplog):
    store = make_store()
    with beating(store, step=3), caplog.at_level("WARNING", logger="kenotron"):
        dog = watch_until_named(store, lambda: 3, activity=lambda: WAITING_FOR_DATA, loader="data.loader=slow.py:build")
    assert re.match(r"rank 0 \(pid \d+ on .*\) has waited \d+ s for its data loader \(data.loader=slow.py:build\) to "
                    r"give the batch after step 3: the loader is stuck or slow", dog.diagnosis), dog.diagnosis
    assert dog.diagnosis in caplog.text  # said by the rank itself: rank 0's is the console


def test_a_peer_waiting_for_its_loader_is_named_with_the_loader_not_as_stuck_in_the_step():
    store = make_store()
    with beating(store, step=2, activity=WAITING_FOR_DATA):
        dog = watch_until_named(store, lambda: 3, loader="data.loader=slow.py:build")
    assert dog.diagnosis == ("rank 1 (pid 4242 on otherhost) is alive but waiting for its data loader "
                             "(data.loader=slow.py:build) after step 2: the loader is stuck or slow")


def test_a_stall_that_outlasts_the_timeout_ends_the_job_with_the_timeout_line_naming_the_suspect():
    # NCCL may not end the job at its timeout (a stopped peer: kernels that never finish); gloo does.
    store = make_store()
    store.set(KEY_PREFIX + "1", "7 3 otherhost 4242")  # rank 1 beat once, then froze
    ended: list[str] = []
    dog = ProgressWatchdog(store, 0, 2, 1.0, lambda: 4, end_job=ended.append, end_grace_s=1.5).start()
    deadline = time.monotonic() + 30
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert len(ended) == 1, "the watchdog did not end the job"
    assert ended[0].startswith("kenotron: a collective timed out after 1 s (parallelism.collective_timeout_s): "
                               "another rank stopped answering, and the backend had not ended the job ")
    assert "so rank 0's watchdog did; before that the watchdog found: rank 1 (pid 4242 on otherhost)" in ended[0]


def test_ranks_stalled_alike_past_the_timeout_are_left_to_the_backend():
    store = make_store()
    ended: list[str] = []
    with beating(store, 4):  # rank 1 alive at this rank's step: nobody is suspect
        dog = ProgressWatchdog(store, 0, 2, 0.5, lambda: 4, end_job=ended.append, end_grace_s=0.5).start()
        time.sleep(3.0)
        dog.stop()
    assert ended == [] and dog.diagnosis == ""
