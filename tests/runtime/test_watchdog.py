"""The progress watchdog in one process, over torch's in-process store: whom it names, and when it stays quiet.

A scenario mostly waits (1-3 s of a watchdog's wall time, the CPU idle), so the scenarios run side by
side, each in a thread of its own with a store of its own, from the module's first test (the
`scenarios` fixture): the module waits as long as its longest scenario, not their sum (~17 s). Each
test asserts on what its own scenario's watchdog said. The loader-hang case stays in its test: it
reads the log through caplog, which only captures during the test."""

from __future__ import annotations

import contextlib
import datetime
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
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


SCENARIOS: list[Callable[[], Any]] = []
"""The waiting scenarios that run side by side (the `scenarios` fixture); each returns what its test reads."""


def scenario(fn: Callable[[], Any]) -> Callable[[], Any]:
    SCENARIOS.append(fn)
    return fn


@pytest.fixture(scope="module")
def scenarios() -> Iterator[dict[Callable[[], Any], Future]]:
    """Every scenario started at once, one thread each: a test reads its own with `.result()`
    (which re-raises what the scenario raised)."""
    with ThreadPoolExecutor(max_workers=len(SCENARIOS), thread_name_prefix="watchdog-scenario") as pool:
        yield {fn: pool.submit(fn) for fn in SCENARIOS}


@scenario
def heartbeat_stops() -> ProgressWatchdog:
    store = make_store()
    store.set(KEY_PREFIX + "1", "7 3 otherhost 4242")  # rank 1 beat once, then froze
    return watch_until_named(store, lambda: 4)  # (after warn_after_s 1 s and stale_after_s 2 s)


def test_a_rank_whose_heartbeat_stops_is_named_as_stopped(scenarios):
    dog = scenarios[heartbeat_stops].result()
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


@scenario
def behind_in_steps() -> ProgressWatchdog:
    store = make_store()
    with beating(store, step=3):
        return watch_until_named(store, lambda: 4)


def test_a_live_rank_behind_in_steps_is_named_as_stuck_inside_the_step(scenarios):
    dog = scenarios[behind_in_steps].result()
    assert dog.diagnosis.startswith("rank 1 (pid 4242 on otherhost) is alive but still at step 3")


@scenario
def stalled_alike() -> ProgressWatchdog:
    store = make_store()
    with beating(store, step=4):  # alive, at the same step as this rank (a long compile)
        return watch(store, lambda: 4, 3.0)


def test_ranks_stalled_alike_are_not_suspected(scenarios):
    assert scenarios[stalled_alike].result().diagnosis == ""


@scenario
def stops_before_its_first_heartbeat() -> tuple[ProgressWatchdog, dist.HashStore]:
    store = make_store()  # rank 1 never published a heartbeat: reading its key would wait 5 s, then fail
    return watch_until_named(store, lambda: 4, within=4.5), store


def test_a_rank_that_stops_before_its_first_heartbeat_is_named_without_blocking_on_its_missing_key(scenarios):
    dog, store = scenarios[stops_before_its_first_heartbeat].result()
    assert dog.diagnosis.startswith("rank 1 has sent no heartbeat since the job started"), dog.diagnosis
    assert store.check([KEY_PREFIX + "0"])  # this rank's own heartbeat is there


def test_a_rank_whose_loader_hangs_names_itself_and_the_loader(caplog):
    store = make_store()
    with beating(store, step=3), caplog.at_level("WARNING", logger="kenotron"):
        dog = watch_until_named(store, lambda: 3, activity=lambda: WAITING_FOR_DATA, loader="data.loader=slow.py:build")
    assert re.match(r"rank 0 \(pid \d+ on .*\) has waited \d+ s for its data loader \(data.loader=slow.py:build\) to "
                    r"give the batch after step 3: the loader is stuck or slow", dog.diagnosis), dog.diagnosis
    assert dog.diagnosis in caplog.text  # said by the rank itself: rank 0's is the console


@scenario
def peer_waiting_for_its_loader() -> ProgressWatchdog:
    store = make_store()
    with beating(store, step=2, activity=WAITING_FOR_DATA):
        return watch_until_named(store, lambda: 3, loader="data.loader=slow.py:build")


def test_a_peer_waiting_for_its_loader_is_named_with_the_loader_not_as_stuck_in_the_step(scenarios):
    assert scenarios[peer_waiting_for_its_loader].result().diagnosis == (
        "rank 1 (pid 4242 on otherhost) is alive but waiting for its data loader "
        "(data.loader=slow.py:build) after step 2: the loader is stuck or slow")


@scenario
def stall_outlasts_the_timeout() -> list[str]:
    # NCCL may not end the job at its timeout (a stopped peer: kernels that never finish); gloo does.
    store = make_store()
    store.set(KEY_PREFIX + "1", "7 3 otherhost 4242")  # rank 1 beat once, then froze
    ended: list[str] = []
    dog = ProgressWatchdog(store, 0, 2, 1.0, lambda: 4, end_job=ended.append, end_grace_s=1.5).start()
    deadline = time.monotonic() + 30
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    return ended


def test_a_stall_that_outlasts_the_timeout_ends_the_job_with_the_timeout_line_naming_the_suspect(scenarios):
    ended = scenarios[stall_outlasts_the_timeout].result()
    assert len(ended) == 1, "the watchdog did not end the job"
    assert ended[0].startswith("kenotron: a collective timed out after 1 s (parallelism.collective_timeout_s): "
                               "another rank stopped answering, and the backend had not ended the job ")
    assert "so rank 0's watchdog did; before that the watchdog found: rank 1 (pid 4242 on otherhost)" in ended[0]


@scenario
def stalled_alike_past_the_timeout() -> tuple[ProgressWatchdog, list[str]]:
    store = make_store()
    ended: list[str] = []
    with beating(store, 4):  # rank 1 alive at this rank's step: nobody is suspect
        dog = ProgressWatchdog(store, 0, 2, 0.5, lambda: 4, end_job=ended.append, end_grace_s=0.5).start()
        time.sleep(3.0)
        dog.stop()
    return dog, ended


def test_ranks_stalled_alike_past_the_timeout_are_left_to_the_backend(scenarios):
    dog, ended = scenarios[stalled_alike_past_the_timeout].result()
    assert ended == [] and dog.diagnosis == ""
