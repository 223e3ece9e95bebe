"""The background lane of tests/ahead.py: jobs run in order ahead of their tests, their results
and errors reach the tests, the marked tests run last, and stopping kills what still runs."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.ahead import MARKER, Job, Lane, Share, marked_last, start


def _wait_for(path: Path, timeout: float = 20) -> str:
    end = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < end, f"{path} was not written in {timeout} s"
        time.sleep(0.02)
    return path.read_text().strip()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of a killed shell is reparented and reaped; a zombie is not alive either.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


def _echo(text: str):
    def job(folder: Path, lane: Lane) -> tuple[str, float]:
        proc = lane.run(["sh", "-c", f"echo {text} > out.txt; echo {text}"], cwd=folder, env=dict(os.environ), timeout=20)
        return proc.stdout.strip(), time.monotonic()
    return job


def test_jobs_run_in_their_order_without_waiting_for_their_tests_and_give_what_they_returned(tmp_path):
    folders = {name: tmp_path / name for name in ("a", "b")}
    for folder in folders.values():
        folder.mkdir()
    lane = Lane({name: Job(_echo(name), folder) for name, folder in folders.items()})
    # Nobody asked for a result yet: the lane runs both jobs on its own.
    assert _wait_for(folders["b"] / "out.txt") == "b"
    (out_a, ended_a), (out_b, ended_b) = lane.result("a"), lane.result("b")
    assert (out_a, out_b) == ("a", "b") and ended_a <= ended_b
    lane.stop()
    assert re.fullmatch(r"run ahead \(tests/ahead.py\): 2 jobs, \d+ s in the background; their tests waited \d+ s "
                        r"for them; longest: \w+ \d+ s, \w+ \d+ s", lane.summary()), lane.summary()


def test_what_a_job_raised_is_raised_by_its_result_and_the_next_job_still_runs(tmp_path):
    def fails(folder: Path, lane: Lane):
        raise ValueError(f"bad value in {folder.name}")

    lane = Lane({"fails": Job(fails, tmp_path), "next": Job(_echo("next"), tmp_path)})
    with pytest.raises(ValueError, match=f"bad value in {tmp_path.name}"):
        lane.result("fails")
    assert lane.result("next")[0] == "next"
    lane.stop()


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    def slow(folder: Path, lane: Lane):
        return lane.run(["sh", "-c", "sleep 60 & echo $! > child; wait"], cwd=folder, env=dict(os.environ),
                        timeout=1)

    lane = Lane({"slow": Job(slow, tmp_path)})
    with pytest.raises(subprocess.TimeoutExpired):
        lane.result("slow")
    child = int(_wait_for(tmp_path / "child"))
    end = time.monotonic() + 10
    while _alive(child) and time.monotonic() < end:
        time.sleep(0.02)
    assert not _alive(child)
    lane.stop()


def test_stopping_the_lane_kills_the_running_command_with_its_children_and_starts_no_other(tmp_path):
    def hangs(folder: Path, lane: Lane):
        return lane.run(["sh", "-c", "sleep 60 & echo $! > child; wait"], cwd=folder, env=dict(os.environ),
                        timeout=120)

    started = time.monotonic()
    lane = Lane({"hangs": Job(hangs, tmp_path), "after": Job(_echo("after"), tmp_path)})
    child = int(_wait_for(tmp_path / "child"))
    lane.stop()
    assert time.monotonic() - started < 30
    end = time.monotonic() + 10
    while _alive(child) and time.monotonic() < end:
        time.sleep(0.02)
    assert not _alive(child)
    assert lane.result("hangs").returncode == -9
    with pytest.raises(RuntimeError, match="session ended before"):
        lane.result("after")
    assert not (tmp_path / "out.txt").exists()


def test_marked_tests_move_to_the_end_in_their_order():
    def item(name: str, marked: bool):
        return SimpleNamespace(name=name, get_closest_marker=lambda m: object() if marked and m == MARKER else None)

    items = [item("a", True), item("b", False), item("c", True), item("d", False)]
    assert [i.name for i in marked_last(items)] == ["b", "d", "a", "c"]


def test_a_skipped_test_gets_no_job_and_no_marked_test_no_lane(tmp_path):
    def item(nodeid: str, marked: bool, skip: bool):
        return SimpleNamespace(
            nodeid=nodeid,
            get_closest_marker=lambda m: SimpleNamespace(kwargs={"job": _echo(nodeid)}) if marked and m == MARKER else None,
            iter_markers=lambda name: iter([SimpleNamespace(args=(True,))] if skip and name == "skipif" else []))

    lane = start([item("runs", True, False), item("skipped", True, True), item("plain", False, False)],
                 lambda name: tmp_path)
    assert list(lane.jobs) == ["runs"] and lane.result("runs")[0] == "runs"
    lane.stop()
    assert start([item("plain", False, False)], lambda name: tmp_path) is None


def test_tests_marked_with_one_function_share_its_one_run(tmp_path):
    runs = []

    def counted(folder: Path, lane: Lane) -> int:
        runs.append(folder)
        return len(runs)

    def item(nodeid: str):
        return SimpleNamespace(nodeid=nodeid, iter_markers=lambda name: iter([]),
                               get_closest_marker=lambda m: SimpleNamespace(kwargs={"job": counted}))

    lane = start([item("first"), item("second")], lambda name: tmp_path)
    assert (lane.result("first"), lane.result("second"), runs) == (1, 1, [tmp_path])
    lane.stop()


def test_processes_started_side_by_side_run_at_once_and_stopping_kills_every_one(tmp_path):
    peers = "touch {me}; i=0; while [ ! -e {peer} ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; echo {me} $i"

    def side_by_side(folder: Path, lane: Lane) -> list[str]:
        procs = [lane.start(["sh", "-c", peers.format(me=me, peer=peer)], cwd=folder, env=dict(os.environ))
                 for me, peer in (("a", "b"), ("b", "a"))]
        return [lane.wait(proc, timeout=30)[0].split() for proc in procs]

    def two_sleepers(folder: Path, lane: Lane) -> list[int]:
        procs = [lane.start(["sh", "-c", f"echo $$ > sleeper{i}; exec sleep 60"], cwd=folder, env=dict(os.environ))
                 for i in range(2)]
        return [lane.wait(proc, timeout=120) and proc.returncode for proc in procs]

    lane = Lane({"peers": Job(side_by_side, tmp_path), "sleepers": Job(two_sleepers, tmp_path)})
    (a, waits_a), (b, waits_b) = lane.result("peers")
    assert (a, b) == ("a", "b") and max(int(waits_a), int(waits_b)) < 2000  # both ran at once
    pids = [int(_wait_for(tmp_path / f"sleeper{i}")) for i in range(2)]
    lane.stop()
    assert lane.result("sleepers") == [-9, -9] and not any(_alive(pid) for pid in pids)


def test_stopping_the_lane_calls_what_a_running_job_registered_for_its_own_processes(tmp_path):
    killed = []

    def registers(folder: Path, lane: Lane) -> str:
        with lane.killed_at_stop(lambda: killed.append(folder.name)):
            if folder.name == "waits":  # "inside" once its command runs: stop comes after that
                lane.run(["sh", "-c", "echo yes > inside; exec sleep 60"], cwd=folder, env=dict(os.environ),
                         timeout=120)
        return folder.name

    (tmp_path / "ends").mkdir()
    (tmp_path / "waits").mkdir()
    ends = Lane({"ends": Job(registers, tmp_path / "ends")})
    assert ends.result("ends") == "ends"
    ends.stop()
    waits = Lane({"waits": Job(registers, tmp_path / "waits")})
    _wait_for(tmp_path / "waits" / "inside")
    waits.stop()
    assert killed == ["waits"] and waits.result("waits") == "waits"  # a job that left it is not called


def _two_workers(tmp_path: Path, fns: dict) -> list[Lane]:
    """The lanes of two xdist workers over the same marked tests, as conftest.py starts them."""
    lanes = []
    for worker in range(2):
        folders = {name: tmp_path / f"gw{worker}" / name for name in fns}
        for folder in folders.values():
            folder.mkdir(parents=True)
        lanes.append(Lane({name: Job(fn, folders[name]) for name, fn in fns.items()},
                          Share(tmp_path / "shared", worker, 2)))
    return lanes


def _ran_by(folder: Path, lane: Lane) -> str:
    with open(folder.parent.parent / "runs.txt", "a") as runs:  # folder is <tmp_path>/gwN/<job>
        runs.write(f"{folder.name} {folder.parent.name}\n")
    return folder.parent.name


def _raises(folder: Path, lane: Lane):
    raise ValueError(f"bad value on {folder.parent.name}")


def test_under_xdist_each_job_runs_on_one_worker_and_every_worker_reads_its_outcome(tmp_path):
    first, second = _two_workers(tmp_path, {"a": _ran_by, "b": _ran_by, "c": _raises})
    # Jobs in order a, b, c go to workers 0, 1, 0; the other worker reads what the owner pickled.
    for lane in (first, second):
        assert (lane.result("a"), lane.result("b")) == ("gw0", "gw1")
        with pytest.raises(ValueError, match="bad value on gw0"):
            lane.result("c")
    for lane in (first, second):
        lane.finish()
        lane.stop()
    assert sorted((tmp_path / "runs.txt").read_text().splitlines()) == ["a gw0", "b gw1"]  # each once
    assert re.search(r"on xdist worker gw1: 1 job, ", second.summary()), second.summary()


def test_under_xdist_a_test_waiting_for_a_job_of_a_worker_that_ended_fails_and_names_it(tmp_path):
    share = Share(tmp_path / "shared", 0, 2)
    job = tmp_path / "gw0" / "job"
    job.mkdir(parents=True)
    dead = str(2**22 + 1)  # above Linux's largest pid: no such process
    share.folder.mkdir()
    share.owner_file(1).write_text(dead)  # worker 1 wrote its pid, then ended without its job
    lane = Lane({"mine": Job(_ran_by, job), "theirs": Job(_ran_by, job)}, share)
    assert lane.result("mine") == "gw0"
    with pytest.raises(RuntimeError, match=rf"worker gw1 \(pid {dead}\), which runs _ran_by, ended before its job"):
        lane.result("theirs")
    lane.stop()
