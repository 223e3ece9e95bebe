"""The progress watchdog in one process, over a dict-backed store: whom it names, and when it stays quiet."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from kenotron.runtime.watchdog import KEY_PREFIX, ProgressWatchdog


class DictStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.values[key] = value.encode()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.lock:
            return [self.values.get(k, b"0 -1 ? ?") for k in keys]


def watch(store: DictStore, progress, seconds: float, timeout_s: float = 2.0) -> ProgressWatchdog:
    """Run a watchdog for `seconds` (all of them: a test that expects silence must wait it out)."""
    dog = ProgressWatchdog(store, 0, 2, timeout_s, progress).start()
    time.sleep(seconds)
    dog.stop()
    return dog


def watch_until_named(store: DictStore, progress, timeout_s: float = 2.0, within: float = 60.0) -> ProgressWatchdog:
    """Run a watchdog until it names a rank (its first diagnosis), failing after `within` seconds."""
    dog = ProgressWatchdog(store, 0, 2, timeout_s, progress).start()
    deadline = time.monotonic() + within
    while not dog.diagnosis and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert dog.diagnosis, f"the watchdog named nobody within {within} s"
    return dog


def test_a_rank_whose_heartbeat_stops_is_named_as_stopped():
    store = DictStore()
    store.set(KEY_PREFIX + "1", "7 3 otherhost 4242")  # rank 1 beat once, then froze
    dog = watch_until_named(store, lambda: 4)  # (after warn_after_s 1 s and stale_after_s 2 s)
    assert "rank 1 (pid 4242 on otherhost) has sent no heartbeat for" in dog.diagnosis
    assert "its last one at step 3" in dog.diagnosis


@contextlib.contextmanager
def beating(store: DictStore, step: int) -> Iterator[None]:
    """Rank 1 alive at `step` while the block runs: a heartbeat every 0.1 s from a thread."""
    done = threading.Event()

    def beat() -> None:
        n = 0
        while not done.is_set():
            n += 1
            store.set(KEY_PREFIX + "1", f"{n} {step} otherhost 4242")
            time.sleep(0.1)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_live_rank_behind_in_steps_is_named_as_stuck_inside_the_step():
    store = DictStore()
    with beating(store, step=3):
        dog = watch_until_named(store, lambda: 4)
    assert dog.diagnosis.startswith("rank 1 (pid 4242 on otherhost) is alive but still at step 3")


def test_ranks_stalled_alike_are_not_suspected():
    store = DictStore()
    with beating(store, step=4):  # alive, at the same step as this rank (a long compile)
        dog = watch(store, lambda: 4, 3.0)
    assert dog.diagnosis == ""
