import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests import ahead

# One OpenMP/BLAS thread in this process and every process it starts (the background lane's
# commands, the fork servers, their children), as the pool's ranks already run: read by OpenMP
# when torch loads, so set before any test module imports it. The tests' models are tiny; a
# second thread gains little, and on CI's two cores, where the lane and the ranks keep both busy,
# OpenMP's threads spin waiting for a descheduled peer: four test files (one with lane jobs) run
# as CI runs them took 156 s and 188 CPU-s with torch's default (two threads), 86 s and 139 CPU-s
# with one. A developer's own OMP_NUM_THREADS is kept.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    if not os.environ.get(_name):  # unset or empty (empty gives torch its default too)
        os.environ[_name] = "1"

ROOT = Path(__file__).resolve().parents[1]
_STRAY = ROOT / "outputs"
_STRAY_BEFORE = _STRAY.exists()


def pytest_collection_finish(session):
    """Freeze what collection built (torch, kenotron, the test modules: ~400k objects) out of the
    garbage collector's reach. Every full collection would walk them again to find nothing to free
    (Python's own; the estimator's per tracked step used to, 0.2 s each, until it recorded its fake
    tensors instead of scanning the heap). Objects made by the tests are collected as usual."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """The tests whose command runs ahead (tests/ahead.py) come last: their commands run meanwhile."""
    items[:] = ahead.marked_last(items)


def pytest_terminal_summary(terminalreporter, config):
    """How long the background lane ran and the tests waited for it: the lane should never be the
    session's last part (if the wait grows, fewer or shorter jobs belong in it)."""
    lane = config.stash.get(_LANE, None)
    if lane is not None:
        terminalreporter.write_line(lane.summary())
    for summary in sorted(config.stash.get(_WORKER_SUMMARIES, [])):
        terminalreporter.write_line(summary)


def pytest_unconfigure(config):
    gc.unfreeze()  # the interpreter's last collection at exit frees them (extensions check for leaks)


@pytest.fixture(scope="session", autouse=True)
def _shutdown_worker_processes():
    """Stop the multi-rank worker pools (tests/distributed/pool.py) and the fork servers
    (tests/fork_server.py) when the session ends, also after -x, a failure or Ctrl-C. Importing
    nothing here keeps torch out of unrelated runs."""
    yield
    pool = sys.modules.get("tests.distributed.pool")
    if pool is not None:
        pool.shutdown_pools()
    servers = sys.modules.get("tests.fork_server")
    if servers is not None:
        servers.shutdown_servers()


_LANE = pytest.StashKey["ahead.Lane | None"]()
_WORKER_SUMMARIES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session", autouse=True)
def _run_ahead_lane(request, tmp_path_factory):
    """Start the commands of the selected `run_ahead` tests when the session starts (tests/ahead.py);
    kill the one still running when it ends (after -x, a failure or Ctrl-C)."""
    share = _xdist_share(request.config, tmp_path_factory)
    lane = request.config.stash[_LANE] = ahead.start(request.session.items, tmp_path_factory.mktemp, share)
    yield lane
    if lane is not None:
        if share is not None and not request.session.shouldstop and not request.session.shouldfail:
            lane.finish()  # another worker's test may still wait for one of this worker's jobs
        lane.stop()
        if share is not None:
            request.config.workeroutput[_SUMMARY] = lane.summary()


def _xdist_share(config, tmp_path_factory) -> "ahead.Share | None":
    """This worker's part of the lane's jobs under pytest-xdist (None without it): the workers'
    temporary folders are `<session's>/gwN`, so their parent is seen by all."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    return ahead.Share(tmp_path_factory.getbasetemp().parent / "run_ahead", int(workerinput["workerid"][2:]),
                       int(workerinput["workercount"]))


_SUMMARY = "run_ahead_summary"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under pytest-xdist: keep each worker's lane summary for the controller's end of session."""
    summary = getattr(node, "workeroutput", {}).get(_SUMMARY)
    if summary:
        node.config.stash.setdefault(_WORKER_SUMMARIES, []).append(summary)


@pytest.fixture
def ran_ahead(request, _run_ahead_lane):
    """What the `run_ahead` function of this test returned (waits for it; raises what it raised)."""
    if _run_ahead_lane is None or request.node.nodeid not in _run_ahead_lane.jobs:
        pytest.fail(f"{request.node.nodeid} uses ran_ahead: mark it @pytest.mark.run_ahead(job=its function)")
    return _run_ahead_lane.result(request.node.nodeid)


@pytest.fixture(autouse=True)
def _tests_write_only_to_temporary_folders(request):
    """A test that leaves `outputs/` (job.dump_folder's default) in the repository fails: tests
    write only under tmp_path. Checked where the folder did not exist when the session began."""
    yield
    if not _STRAY_BEFORE and _STRAY.exists():
        shutil.rmtree(_STRAY, ignore_errors=True)
        pytest.fail(f"{request.node.nodeid} wrote {_STRAY}: give it --job.dump_folder under tmp_path")
