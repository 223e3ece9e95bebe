"""Tests of the multi-rank harness itself (tests/distributed/pool.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from tests.ahead import Lane
from tests.distributed.pool import (
    RankError,
    RankTimeout,
    close_pool,
    get_pool,
    multirank,
    run_on_ranks,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- functions that run on the ranks (module level, so the ranks can import them) ----------------


def _rank_info():
    return (
        dist.get_rank(),
        dist.get_world_size(),
        dist.get_backend(),
        os.getpid(),
        torch.get_num_threads(),
        os.environ.get("OMP_NUM_THREADS"),
    )


def _all_reduce_rank_plus_one():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def _mesh_2d():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, group=tp.get_group())
    return (
        mesh.get_coordinate(),
        dp.size(),
        tp.size(),
        dist.get_world_size(dp.get_group()),
        dist.get_world_size(tp.get_group()),
        t.item(),
    )


def _dtensor_on_fresh_mesh():
    from torch.distributed import distributed_c10d as c10d

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = torch.randn(8, 8)  # the same on every rank: the RNG is seeded with 0 for each call
    d = distribute_tensor(x, mesh["tp"], [Shard(0)])
    y = (d @ d.T).redistribute(mesh["tp"], [Replicate()]).to_local()
    torch.testing.assert_close(y, x @ x.T)
    return len(c10d._world.pg_map), len(os.listdir("/proc/self/fd"))


def _group_count():
    from torch.distributed import distributed_c10d as c10d

    return len(c10d._world.pg_map)


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        print("diagnostic line from rank 1", file=sys.stderr, flush=True)
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1, which never comes


def _sleep_on_rank_1(seconds):
    if dist.get_rank() == 1:
        time.sleep(seconds)
    return dist.get_rank()


def _exit_on_rank_0():
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def _print_rank():
    print(f"hello from rank {dist.get_rank()}")
    print(f"warning from rank {dist.get_rank()}", file=sys.stderr)


def _random_numbers(reseed):
    out = torch.rand(3)
    if reseed:
        torch.manual_seed(1234)  # must not leak into the next call
    return out


def _echo(*args, **kwargs):
    return dist.get_rank(), args, kwargs


def _noop():
    return None


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_world_size_and_order(world_size):
    infos = run_on_ranks(world_size, _rank_info)
    assert [i[0] for i in infos] == list(range(world_size))
    assert all(i[1] == world_size and i[2] == "gloo" for i in infos)
    assert len({i[3] for i in infos}) == world_size
    assert all(i[4] == 1 and i[5] == "1" for i in infos)


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce(world_size):
    assert (
        run_on_ranks(world_size, _all_reduce_rank_plus_one)
        == [world_size * (world_size + 1) / 2] * world_size
    )


def test_arguments_pass_through():
    results = run_on_ranks(2, _echo, 1, torch.arange(3), name="x")
    for rank, (r, args, kwargs) in enumerate(results):
        assert (
            r == rank
            and args[0] == 1
            and torch.equal(args[1], torch.arange(3))
            and kwargs == {"name": "x"}
        )


def test_device_mesh_2d():
    results = run_on_ranks(4, _mesh_2d)
    for rank, (coord, dp_size, tp_size, dp_group, tp_group, tp_sum) in enumerate(results):
        assert list(coord) == [rank // 2, rank % 2]
        assert (dp_size, tp_size, dp_group, tp_group) == (2, 2, 2, 2)
        assert tp_sum == sum(r for r in range(4) if r // 2 == rank // 2)


def test_meshes_do_not_accumulate():
    # Every init_device_mesh makes new gloo groups (a 2x2 mesh: ~10 fds and ~6 threads per rank,
    # freed only by a full gc); the pool destroys them after each call, and clears DTensor's caches,
    # which would otherwise hand the next call an equal old mesh whose groups are gone.
    run_on_ranks(4, _dtensor_on_fresh_mesh)  # one-off lazy initializations
    first = run_on_ranks(4, _dtensor_on_fresh_mesh)
    for _ in range(5):
        last = run_on_ranks(4, _dtensor_on_fresh_mesh)
    assert run_on_ranks(4, _group_count) == [1] * 4
    assert [fds for _, fds in last] == [fds for _, fds in first]


def test_exception_surfaces_with_traceback_and_pool_recovers():
    pids = get_pool(2).pids
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run_on_ranks(2, _fail_on_rank_1)
    assert time.monotonic() - start < 15  # not the 60 s gloo timeout rank 0 is stuck in
    message = str(info.value)
    assert (
        "boom on rank 1" in message and "_fail_on_rank_1" in message and "test_pool.py" in message
    )
    assert "diagnostic line from rank 1" in message  # the failing rank's stderr tail
    assert "rank 0: still running" in message  # and where the other rank was stuck
    assert isinstance(info.value.__cause__, ValueError)
    assert set(info.value.failures) == {0, 1}
    # the pool was replaced by a fresh one that works
    assert [i[0] for i in run_on_ranks(2, _rank_info)] == [0, 1]
    assert set(get_pool(2).pids).isdisjoint(pids)


def test_timeout_surfaces_and_pool_recovers():
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        run_on_ranks(2, _sleep_on_rank_1, 60, timeout=1.0)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "ranks [1] did not finish" in message
    assert "_sleep_on_rank_1" in message  # faulthandler's dump of the hung rank's stack
    assert run_on_ranks(2, _sleep_on_rank_1, 0) == [0, 1]


def _preloaded_modules() -> list[str]:
    return [name for name in ("kenotron.train.trainer", "kenotron.data.corpus") if name in sys.modules]


def test_new_workers_start_with_the_trainer_and_the_corpus_imported_by_the_fork_server():
    """tests/distributed/preload.py runs once in the fork server (pool.py's _PRELOAD), not once per
    worker: it was missing from the list, and every worker paid the imports on its first call."""
    close_pool(2)  # workers forked now, before any call imported anything in them
    assert run_on_ranks(2, _preloaded_modules) == [["kenotron.train.trainer", "kenotron.data.corpus"]] * 2


def test_dead_rank_surfaces_and_pool_recovers():
    with pytest.raises(RankError, match="rank 0 died \\(exit code 3\\)"):
        run_on_ranks(2, _exit_on_rank_0, timeout=30)
    assert run_on_ranks(2, _sleep_on_rank_1, 0) == [0, 1]


def test_rank_output_is_forwarded(capsys):
    run_on_ranks(2, _print_rank)
    captured = capsys.readouterr()
    assert (
        "[rank 0] hello from rank 0" in captured.out
        and "[rank 1] hello from rank 1" in captured.out
    )
    assert "[rank 1] warning from rank 1" in captured.err


def test_rng_is_seeded_for_every_call():
    first = run_on_ranks(2, _random_numbers, True)
    second = run_on_ranks(2, _random_numbers, False)
    torch.testing.assert_close(first[0], first[1])  # same seed on every rank
    torch.testing.assert_close(first[0], second[0])  # the reseed did not leak into the next call


def test_rejects_functions_the_ranks_cannot_import():
    with pytest.raises(TypeError, match="module-level function"):
        run_on_ranks(2, lambda: None)


@multirank(world_size=2)
def test_multirank_decorator():
    assert dist.get_world_size() == 2
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.parametrize("value", [3, 5])
@multirank(world_size=4)
def test_multirank_decorator_with_parameters(value):
    t = torch.tensor([float(value)])
    dist.all_reduce(t)
    assert t.item() == 4 * value


@pytest.mark.parametrize("world_size", [2, 4])
def test_call_overhead(world_size):
    run_on_ranks(world_size, _noop)  # the pool is started
    n = 20
    start = time.perf_counter()
    for _ in range(n):
        run_on_ranks(world_size, _noop)
    mean = (time.perf_counter() - start) / n
    print(f"\n{world_size} ranks: mean per-call overhead {mean * 1e3:.2f} ms over {n} calls")
    assert mean < 0.3


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {root!r})
    from tests.distributed.pool import get_pool, run_on_ranks
    from tests.distributed.test_pool import _noop
    run_on_ranks(2, _noop)
    print(" ".join(map(str, get_pool(2).pids)), flush=True)
    os.kill(os.getpid(), 9)  # no cleanup code runs in this process
    """
)


def kill_a_pool_owner(folder: Path, lane: Lane) -> tuple[subprocess.CompletedProcess, list[int]]:
    """The `run_ahead` job (tests/ahead.py): a Python that starts a pool of 2 and is then killed
    outright (its imports and the pool's start: seconds, run in the background lane); gives the
    process and which of its workers were still alive 10 s after it died (none, polled every 0.1 s)."""
    proc = lane.run([sys.executable, "-c", _ORPHAN_SCRIPT.format(root=REPO_ROOT)], cwd=folder, env=dict(os.environ),
                    timeout=120)
    pids = [int(p) for p in proc.stdout.split()] if proc.returncode == -signal.SIGKILL else []
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _alive(p)]
    return proc, alive


@pytest.mark.slow
@pytest.mark.run_ahead(job=kill_a_pool_owner)
def test_workers_exit_when_the_parent_is_killed(ran_ahead):
    proc, alive = ran_ahead
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    assert not alive, f"workers {alive} outlived their parent"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited already
    except FileNotFoundError:
        return False
